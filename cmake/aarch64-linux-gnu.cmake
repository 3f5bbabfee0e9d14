# aarch64-linux-gnu.cmake - a cross build of baton for 64-bit ARM Linux with
# Debian's gcc-aarch64-linux-gnu, its tests run under qemu-user:
#
#   cmake -S . -B build-arm -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   cmake --build build-arm -j2 && (cd build-arm && ctest)
#
# The build holds libbaton (the core and the CPU backend, every NEON variant:
# backends/cpu/cpu_variant.h) and the kernel and model tests (BATON_CORE_ONLY):
# the target's libyaml, PCRE2, MPI and libmicrohttpd are not installed beside
# the cross compiler.  docs/testing.md describes it.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
# pkg-config looks only at the target's libraries (none of the host's)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/aarch64-linux-gnu/lib/pkgconfig)
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")
# ctest runs each test program under qemu-user: on qemu's default CPU (max,
# which has dotprod and i8mm: the i8mm variant), and the narrower variants'
# tests on CPUs without the wider variants' instructions (ARMv8.0, and
# ARMv8.2 with dotprod but no i8mm)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /usr/aarch64-linux-gnu)
set(BATON_QEMU_CPU_neon cortex-a57)
set(BATON_QEMU_CPU_dotprod neoverse-n1)
set(BATON_CORE_ONLY ON CACHE BOOL "" FORCE)
set(BATON_NATIVE OFF CACHE BOOL "" FORCE)
set(BATON_CUDA OFF CACHE STRING "" FORCE)
