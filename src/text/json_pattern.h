/* json_pattern.h - a JSON schema's `pattern` (an ECMAScript regular
 * expression, a subset) compiled into rules of a byte grammar (grammar.h):
 * the bodies of JSON strings (the bytes between the quotes) whose decoded
 * text the pattern matches.
 *
 * Supported: literal characters (UTF-8), escaped punctuation, \t \n \r \f
 * \v \0 \xHH \uHHHH (a surrogate pair as one character), \d \D \w \W \s
 * \S, classes [...] and [^...] with ranges and those escapes ([\b] is a
 * backspace), `.` (any character but a line terminator), groups (...) and
 * (?:...), alternation |, the quantifiers ? * + {m} {m,} {m,n} (a lazy `?`
 * after one changes nothing here), and the anchors ^ and $ at the start and
 * end of the pattern or of one of its top-level alternatives.  A side
 * without its anchor is free: the pattern may match anywhere in the string,
 * as JSON Schema says (llama.cpp's converter takes an unanchored pattern
 * as any string).  Everything else (lookarounds, backreferences, \b as a
 * word boundary, \p{...}, named groups, flags) is refused with its offset.
 *
 * Each character is written the one way a JSON encoder writes it: itself
 * when printable, \" and \\, \b \t \n \f \r, else \u00xx (lower case).
 * Repetition counts are capped at BT_JSON_SCHEMA_MAX_COUNT, groups nest at
 * most BT_JSON_SCHEMA_MAX_DEPTH deep, and an unbounded repetition of what
 * may be empty ((a*)*) is refused; the grammar grows linearly with the
 * pattern and its counts (a nested count refers to its inner rule once). */
#ifndef BATON_TEXT_JSON_PATTERN_H
#define BATON_TEXT_JSON_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include "grammar.h"

/* A rule of g for the string bodies pattern[0..len) matches; any_char is
 * the rule of one JSON string character (what an unanchored side repeats).
 * Returns -1 with a message in err and the byte offset at fault in *at, or
 * -1 with err "" when the grammar passed a bound (bt_grammar_error). */
int32_t bt_json_pattern_rule(bt_grammar *g, int32_t any_char, const char *pattern, size_t len, size_t *at, char *err,
                             size_t errlen);

#endif
