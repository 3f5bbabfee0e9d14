/* json_schema.h - JSON schemas compiled into byte grammars (grammar.h): the
 * texts a schema allows, written as JSON with optional whitespace, for
 * response_format and tool arguments.
 *
 * Supported: type (one or a list of object, array, string, number, integer,
 * boolean, null), properties / required / additionalProperties (absent or
 * false: no other keys, as llama.cpp's converter; true or a schema: other
 * keys after the listed ones), items / minItems / maxItems, prefixItems (or
 * items as an array: a tuple of exactly those schemas, as llama.cpp),
 * uniqueItems false, minLength / maxLength, pattern (json_pattern.h),
 * format (date, time, date-time, uuid and uuid1..uuid5 with llama.cpp's
 * rules; any other format is an annotation, as llama.cpp), minimum /
 * maximum / exclusiveMinimum / exclusiveMaximum on integers (every integer
 * of at most 16 digits within them and no other; a fractional bound
 * rounded inwards; on numbers they are not enforced, as llama.cpp), enum,
 * const, anyOf, oneOf (as anyOf: exclusivity is not checked), allOf of one
 * schema, $ref to a JSON pointer in the same document ("#/$defs/Name",
 * "#/definitions/Name", "#"); the annotations title, description, default,
 * examples, $schema, $id, $comment, $defs, definitions, deprecated,
 * readOnly, writeOnly are ignored.  A string takes one of pattern, a known
 * format, or lengths: two of them together are refused, as is every other
 * keyword (multipleOf, minProperties, uniqueItems true, not, ...), with
 * its path, rather than an output that might break it.  Without a type,
 * properties or additionalProperties make an object, items or prefixItems
 * an array, pattern, a known format or a length a string.
 *
 * Properties come in the schema's order; a required one must appear, an
 * optional one may be left out.  Numbers have at most 16 integer and 16
 * fraction digits and a 3-digit exponent (llama.cpp's bounds), so a number
 * ends; strings and lists end only where the schema bounds them
 * (maxLength, maxItems, enum). */
#ifndef BATON_TEXT_JSON_SCHEMA_H
#define BATON_TEXT_JSON_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

#ifndef BT_JSON_SCHEMA_MAX_DEPTH
#define BT_JSON_SCHEMA_MAX_DEPTH 64 /* schemas nested in schemas */
#endif
#ifndef BT_JSON_SCHEMA_MAX_NODES
#define BT_JSON_SCHEMA_MAX_NODES 4096 /* schemas visited in one document ($refs counted once) */
#endif
#ifndef BT_JSON_SCHEMA_MAX_COUNT
#define BT_JSON_SCHEMA_MAX_COUNT 4096 /* the largest min/maxItems, min/maxLength; entries of enum, anyOf */
#endif

/* The rules of one grammar shared by every schema compiled into it (-1:
 * not made yet). */
typedef struct bt_json_rules {
    bt_grammar *g;
    int32_t ws, str, chr, num, integer, value, object;
} bt_json_rules;
void bt_json_rules_init(bt_json_rules *j, bt_grammar *g);

/* A rule of j->g for the values schema[0..len) (a JSON text) allows.
 * Returns the rule, or -1 with a message in err and, in where, the path of
 * the schema at fault inside the document ("" for the root,
 * "properties.tags.items", "$defs.Node.anyOf[1]"). */
int32_t bt_json_schema_compile(bt_json_rules *j, const char *schema, size_t len, char *where, size_t wherelen,
                               char *err, size_t errlen);
/* A rule for any JSON value, for any JSON object (-1: a bound or out of
 * memory, bt_grammar_error). */
int32_t bt_json_value_rule(bt_json_rules *j);
int32_t bt_json_object_rule(bt_json_rules *j);
/* Optional whitespace between JSON tokens: nothing, a space, or a newline
 * and up to 20 spaces or tabs. */
int32_t bt_json_ws_rule(bt_json_rules *j);

#endif
