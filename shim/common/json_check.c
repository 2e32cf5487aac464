/*
 * json_check.c - see json_check.h. A recursive-descent recogniser: it
 * builds nothing, only walks the grammar.
 */
#include <stdio.h>
#include <string.h>

#include "json_check.h"

typedef struct cursor {
    const char *s;
    size_t n, i;
    int depth;
    const char *error;
} cursor;

enum { MAX_DEPTH = 64 };

static bool fail(cursor *c, const char *what)
{
    if (!c->error)
        c->error = what;
    return false;
}

static void spaces(cursor *c)
{
    while (c->i < c->n && strchr(" \t\r\n", c->s[c->i]) && c->s[c->i])
        c->i++;
}

static bool peek(const cursor *c, char ch) { return c->i < c->n && c->s[c->i] == ch; }

static bool literal(cursor *c, const char *word)
{
    size_t k = strlen(word);
    if (c->n - c->i < k || memcmp(c->s + c->i, word, k) != 0)
        return fail(c, "an unknown word");
    c->i += k;
    return true;
}

static bool digits(cursor *c)
{
    size_t start = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9')
        c->i++;
    return c->i > start || fail(c, "a number without digits");
}

static bool number(cursor *c)
{
    if (peek(c, '-'))
        c->i++;
    if (peek(c, '0'))
        c->i++;
    else if (!digits(c))
        return false;
    if (peek(c, '.')) {
        c->i++;
        if (!digits(c))
            return false;
    }
    if (peek(c, 'e') || peek(c, 'E')) {
        c->i++;
        if (peek(c, '+') || peek(c, '-'))
            c->i++;
        if (!digits(c))
            return false;
    }
    return true;
}

static bool string(cursor *c)
{
    c->i++; /* the opening quote */
    while (c->i < c->n) {
        unsigned char ch = (unsigned char)c->s[c->i++];
        if (ch == '"')
            return true;
        if (ch < 0x20)
            return fail(c, "a control character inside a string");
        if (ch == '\\') {
            if (c->i >= c->n)
                break;
            char e = c->s[c->i++];
            if (e == 'u') {
                for (int k = 0; k < 4; k++, c->i++)
                    if (c->i >= c->n || !strchr("0123456789abcdefABCDEF", c->s[c->i]) ||
                        !c->s[c->i])
                        return fail(c, "a bad \\u escape");
            } else if (!strchr("\"\\/bfnrt", e) || !e) {
                return fail(c, "a bad escape");
            }
        }
    }
    return fail(c, "an unterminated string");
}

static bool value(cursor *c);

/* The members of an object or the elements of an array, after the opening
 * bracket, up to and including `close`. */
static bool members(cursor *c, char close, bool keyed)
{
    if (++c->depth > MAX_DEPTH)
        return fail(c, "nesting deeper than 64");
    spaces(c);
    if (peek(c, close)) {
        c->i++;
        c->depth--;
        return true;
    }
    for (;;) {
        spaces(c);
        if (keyed) {
            if (!peek(c, '"'))
                return fail(c, "an object key that is not a string");
            if (!string(c))
                return false;
            spaces(c);
            if (!peek(c, ':'))
                return fail(c, "a missing ':'");
            c->i++;
        }
        if (!value(c))
            return false;
        spaces(c);
        if (peek(c, ',')) {
            c->i++;
            continue;
        }
        if (peek(c, close)) {
            c->i++;
            c->depth--;
            return true;
        }
        return fail(c, keyed ? "a missing ',' or '}'" : "a missing ',' or ']'");
    }
}

static bool value(cursor *c)
{
    spaces(c);
    if (c->i >= c->n)
        return fail(c, "the end of the text where a value belongs");
    switch (c->s[c->i]) {
    case '{': c->i++; return members(c, '}', true);
    case '[': c->i++; return members(c, ']', false);
    case '"': return string(c);
    case 't': return literal(c, "true");
    case 'f': return literal(c, "false");
    case 'n': return literal(c, "null");
    default:
        if (c->s[c->i] == '-' || (c->s[c->i] >= '0' && c->s[c->i] <= '9'))
            return number(c);
        return fail(c, "a character that starts no value");
    }
}

bool json_check(const char *text, size_t n, char *why, size_t len)
{
    cursor c = {text, n, 0, 0, NULL};
    bool ok = value(&c);
    if (ok) {
        spaces(&c);
        if (c.i != n)
            ok = fail(&c, "text after the value");
    }
    if (!ok && why && len)
        snprintf(why, len, "%s at byte %zu", c.error, c.i);
    return ok;
}
