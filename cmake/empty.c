/* empty.c - libbaton.so is made of libbaton.a's objects (CMakeLists.txt); a shared
 * library target needs one source of its own. */
typedef int bt_empty_translation_unit;
