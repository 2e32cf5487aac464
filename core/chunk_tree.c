/*
 * chunk_tree.c - red-black tree over chunk records (see chunk_tree.h).
 *
 * The algorithm is the textbook one (Cormen et al., ch. 13) with a sentinel,
 * written over 32-bit handles. Accessor macros keep the fix-up code close to
 * its usual reading.
 */
#include "chunk_tree.h"

#define N(i) chunk_at(s, (i))
#define L(i) (N(i)->left)
#define R(i) (N(i)->right)
#define P(i) (N(i)->parent)
#define RED(i) (N(i)->red)

static inline int key_less(const chunk *a, const chunk *b)
{
    return a->size < b->size || (a->size == b->size && a->addr < b->addr);
}

static void rotate_left(chunk_store *s, uint32_t *root, uint32_t x)
{
    uint32_t y = R(x);
    R(x) = L(y);
    if (L(y) != CHUNK_NIL)
        P(L(y)) = x;
    P(y) = P(x);
    if (P(x) == CHUNK_NIL)
        *root = y;
    else if (x == L(P(x)))
        L(P(x)) = y;
    else
        R(P(x)) = y;
    L(y) = x;
    P(x) = y;
}

static void rotate_right(chunk_store *s, uint32_t *root, uint32_t x)
{
    uint32_t y = L(x);
    L(x) = R(y);
    if (R(y) != CHUNK_NIL)
        P(R(y)) = x;
    P(y) = P(x);
    if (P(x) == CHUNK_NIL)
        *root = y;
    else if (x == R(P(x)))
        R(P(x)) = y;
    else
        L(P(x)) = y;
    R(y) = x;
    P(x) = y;
}

void tree_insert(chunk_store *s, uint32_t *root, uint32_t z)
{
    const chunk *zc = N(z);
    uint32_t y = CHUNK_NIL, x = *root;
    while (x != CHUNK_NIL) {
        y = x;
        x = key_less(zc, N(x)) ? L(x) : R(x);
    }
    P(z) = y;
    if (y == CHUNK_NIL)
        *root = z;
    else if (key_less(zc, N(y)))
        L(y) = z;
    else
        R(y) = z;
    L(z) = R(z) = CHUNK_NIL;
    RED(z) = 1;

    while (RED(P(z))) {
        uint32_t g = P(P(z));
        if (P(z) == L(g)) {
            uint32_t u = R(g);
            if (RED(u)) {
                RED(P(z)) = 0;
                RED(u) = 0;
                RED(g) = 1;
                z = g;
            } else {
                if (z == R(P(z))) {
                    z = P(z);
                    rotate_left(s, root, z);
                }
                RED(P(z)) = 0;
                RED(P(P(z))) = 1;
                rotate_right(s, root, P(P(z)));
            }
        } else {
            uint32_t u = L(g);
            if (RED(u)) {
                RED(P(z)) = 0;
                RED(u) = 0;
                RED(g) = 1;
                z = g;
            } else {
                if (z == L(P(z))) {
                    z = P(z);
                    rotate_right(s, root, z);
                }
                RED(P(z)) = 0;
                RED(P(P(z))) = 1;
                rotate_left(s, root, P(P(z)));
            }
        }
    }
    RED(*root) = 0;
}

static void transplant(chunk_store *s, uint32_t *root, uint32_t u, uint32_t v)
{
    if (P(u) == CHUNK_NIL)
        *root = v;
    else if (u == L(P(u)))
        L(P(u)) = v;
    else
        R(P(u)) = v;
    P(v) = P(u); /* writes the sentinel's parent when v is NIL: intended */
}

static uint32_t subtree_min(const chunk_store *s, uint32_t x)
{
    while (L(x) != CHUNK_NIL)
        x = L(x);
    return x;
}

static void remove_fixup(chunk_store *s, uint32_t *root, uint32_t x)
{
    while (x != *root && !RED(x)) {
        if (x == L(P(x))) {
            uint32_t w = R(P(x));
            if (RED(w)) {
                RED(w) = 0;
                RED(P(x)) = 1;
                rotate_left(s, root, P(x));
                w = R(P(x));
            }
            if (!RED(L(w)) && !RED(R(w))) {
                RED(w) = 1;
                x = P(x);
            } else {
                if (!RED(R(w))) {
                    RED(L(w)) = 0;
                    RED(w) = 1;
                    rotate_right(s, root, w);
                    w = R(P(x));
                }
                RED(w) = RED(P(x));
                RED(P(x)) = 0;
                RED(R(w)) = 0;
                rotate_left(s, root, P(x));
                x = *root;
            }
        } else {
            uint32_t w = L(P(x));
            if (RED(w)) {
                RED(w) = 0;
                RED(P(x)) = 1;
                rotate_right(s, root, P(x));
                w = L(P(x));
            }
            if (!RED(R(w)) && !RED(L(w))) {
                RED(w) = 1;
                x = P(x);
            } else {
                if (!RED(L(w))) {
                    RED(R(w)) = 0;
                    RED(w) = 1;
                    rotate_left(s, root, w);
                    w = L(P(x));
                }
                RED(w) = RED(P(x));
                RED(P(x)) = 0;
                RED(L(w)) = 0;
                rotate_right(s, root, P(x));
                x = *root;
            }
        }
    }
    RED(x) = 0;
}

void tree_remove(chunk_store *s, uint32_t *root, uint32_t z)
{
    uint32_t y = z, x;
    int y_was_red = RED(y);
    if (L(z) == CHUNK_NIL) {
        x = R(z);
        transplant(s, root, z, R(z));
    } else if (R(z) == CHUNK_NIL) {
        x = L(z);
        transplant(s, root, z, L(z));
    } else {
        y = subtree_min(s, R(z));
        y_was_red = RED(y);
        x = R(y);
        if (P(y) == z) {
            P(x) = y;
        } else {
            transplant(s, root, y, R(y));
            R(y) = R(z);
            P(R(y)) = y;
        }
        transplant(s, root, z, y);
        L(y) = L(z);
        P(L(y)) = y;
        RED(y) = RED(z);
    }
    if (!y_was_red)
        remove_fixup(s, root, x);
    /* The sentinel must stay black and detached for the next operation. */
    RED(CHUNK_NIL) = 0;
    L(z) = R(z) = P(z) = CHUNK_NIL;
    RED(z) = 0;
}

void tree_replace(chunk_store *s, uint32_t *root, uint32_t old, uint32_t by)
{
    chunk *o = N(old), *b = N(by);
    b->left = o->left;
    b->right = o->right;
    b->parent = o->parent;
    b->red = o->red;
    if (o->parent == CHUNK_NIL)
        *root = by;
    else if (L(o->parent) == old)
        L(o->parent) = by;
    else
        R(o->parent) = by;
    if (o->left != CHUNK_NIL)
        P(o->left) = by;
    if (o->right != CHUNK_NIL)
        P(o->right) = by;
    o->left = o->right = o->parent = CHUNK_NIL;
    o->red = 0;
}

uint32_t tree_lower_bound(const chunk_store *s, uint32_t root, uint64_t size)
{
    uint32_t best = CHUNK_NIL;
    while (root != CHUNK_NIL) {
        if (N(root)->size >= size) {
            best = root;
            root = L(root);
        } else {
            root = R(root);
        }
    }
    return best;
}

uint32_t tree_first(const chunk_store *s, uint32_t root)
{
    return root == CHUNK_NIL ? CHUNK_NIL : subtree_min(s, root);
}

uint32_t tree_last(const chunk_store *s, uint32_t root)
{
    if (root == CHUNK_NIL)
        return CHUNK_NIL;
    while (R(root) != CHUNK_NIL)
        root = R(root);
    return root;
}

uint32_t tree_next(const chunk_store *s, uint32_t x)
{
    if (R(x) != CHUNK_NIL)
        return subtree_min(s, R(x));
    uint32_t y = P(x);
    while (y != CHUNK_NIL && x == R(y)) {
        x = y;
        y = P(y);
    }
    return y;
}

uint32_t tree_prev(const chunk_store *s, uint32_t x)
{
    if (L(x) != CHUNK_NIL) {
        x = L(x);
        while (R(x) != CHUNK_NIL)
            x = R(x);
        return x;
    }
    uint32_t y = P(x);
    while (y != CHUNK_NIL && x == L(y)) {
        x = y;
        y = P(y);
    }
    return y;
}

/* Recursive check of one subtree; returns its black height or -1. Depth is
 * bounded by 2 log2(n) for a valid tree, and a broken one is cut off at 128. */
static long validate(const chunk_store *s, uint32_t x, uint32_t parent,
                     const chunk *lo, const chunk *hi, long *count, int depth,
                     FILE *err)
{
    if (x == CHUNK_NIL)
        return 1;
    const chunk *c = N(x);
    if (depth > 128) {
        if (err)
            fprintf(err, "tree: depth above 128 at chunk %u (cycle?)\n", x);
        return -1;
    }
    if (c->parent != parent) {
        if (err)
            fprintf(err, "tree: chunk %u has parent %u, expected %u\n", x,
                    c->parent, parent);
        return -1;
    }
    if ((lo && !key_less(lo, c)) || (hi && !key_less(c, hi))) {
        if (err)
            fprintf(err, "tree: chunk %u (size %llu addr 0x%llx) out of order\n",
                    x, (unsigned long long)c->size, (unsigned long long)c->addr);
        return -1;
    }
    if (c->red && (RED(c->left) || RED(c->right))) {
        if (err)
            fprintf(err, "tree: red chunk %u has a red child\n", x);
        return -1;
    }
    (*count)++;
    long lh = validate(s, c->left, x, lo, c, count, depth + 1, err);
    if (lh < 0)
        return -1;
    long rh = validate(s, c->right, x, c, hi, count, depth + 1, err);
    if (rh < 0)
        return -1;
    if (lh != rh) {
        if (err)
            fprintf(err, "tree: black heights %ld and %ld differ below chunk %u\n",
                    lh, rh, x);
        return -1;
    }
    return lh + (c->red ? 0 : 1);
}

long tree_validate(const chunk_store *s, uint32_t root, FILE *err)
{
    if (RED(CHUNK_NIL)) {
        if (err)
            fprintf(err, "tree: sentinel is red\n");
        return -1;
    }
    if (root != CHUNK_NIL && RED(root)) {
        if (err)
            fprintf(err, "tree: root %u is red\n", root);
        return -1;
    }
    long count = 0;
    if (validate(s, root, CHUNK_NIL, NULL, NULL, &count, 0, err) < 0)
        return -1;
    return count;
}
