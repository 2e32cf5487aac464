/* The red-black tree of chunk handles, against a brute-force model. */
#include <string.h>

#include "chunk_tree.h"
#include "harness.h"

#define MAXN 3000

static chunk_store store;
static uint32_t present[MAXN];
static size_t npresent;

static uint32_t model_lower_bound(uint64_t size)
{
    uint32_t best = CHUNK_NIL;
    for (size_t i = 0; i < npresent; i++) {
        const chunk *c = chunk_at(&store, present[i]);
        if (c->size < size)
            continue;
        if (best == CHUNK_NIL) {
            best = present[i];
            continue;
        }
        const chunk *b = chunk_at(&store, best);
        if (c->size < b->size || (c->size == b->size && c->addr < b->addr))
            best = present[i];
    }
    return best;
}

static void random_inserts_and_removes_keep_order(void)
{
    REQUIRE(chunk_store_init(&store));
    REQUIRE(chunk_store_reserve(&store, MAXN));
    uint32_t root = CHUNK_NIL;
    uint64_t rng = 42;
    for (int step = 0; step < 40000; step++) {
        bool insert = npresent == 0 || (npresent < MAXN && rng_below(&rng, 100) < 55);
        if (insert) {
            uint32_t c = chunk_new(&store);
            /* Few distinct sizes: many ties broken by address. */
            chunk_at(&store, c)->size = (rng_below(&rng, 40) + 1) * 256;
            chunk_at(&store, c)->addr = (uint64_t)c * 4096;
            tree_insert(&store, &root, c);
            present[npresent++] = c;
        } else {
            size_t i = rng_below(&rng, npresent);
            tree_remove(&store, &root, present[i]);
            chunk_release(&store, present[i]);
            present[i] = present[--npresent];
        }
        if (step % 97 == 0 || npresent < 8) {
            long n = tree_validate(&store, root, stderr);
            CHECK_EQ(n, npresent);
            uint64_t q = (rng_below(&rng, 42) + 1) * 256;
            CHECK_EQ(tree_lower_bound(&store, root, q), model_lower_bound(q));
            /* In-order walk visits every node once, ascending. */
            size_t seen = 0;
            uint32_t last = CHUNK_NIL;
            for (uint32_t c = tree_first(&store, root); c != CHUNK_NIL;
                 c = tree_next(&store, c)) {
                const chunk *cc = chunk_at(&store, c);
                if (last != CHUNK_NIL) {
                    const chunk *pc = chunk_at(&store, last);
                    CHECK(pc->size < cc->size ||
                          (pc->size == cc->size && pc->addr < cc->addr));
                }
                last = c;
                seen++;
            }
            CHECK_EQ(seen, npresent);
            CHECK_EQ(tree_last(&store, root), last);
        }
        if (harness_failures)
            break;
    }
    chunk_store_fini(&store);
}

static void validator_catches_broken_trees(void)
{
    REQUIRE(chunk_store_init(&store));
    REQUIRE(chunk_store_reserve(&store, 8));
    uint32_t root = CHUNK_NIL, n[5];
    for (int i = 0; i < 5; i++) {
        n[i] = chunk_new(&store);
        chunk_at(&store, n[i])->size = 256u * (unsigned)(i + 1);
        chunk_at(&store, n[i])->addr = 0x1000u * (unsigned)(i + 1);
        tree_insert(&store, &root, n[i]);
    }
    FILE *sink = fopen("/dev/null", "w");
    CHECK(tree_validate(&store, root, sink) == 5);
    /* Out-of-order key. */
    uint64_t saved = chunk_at(&store, root)->size;
    chunk_at(&store, root)->size = 1u << 30;
    CHECK(tree_validate(&store, root, sink) < 0);
    chunk_at(&store, root)->size = saved;
    /* Red root. */
    chunk_at(&store, root)->red = 1;
    CHECK(tree_validate(&store, root, sink) < 0);
    chunk_at(&store, root)->red = 0;
    /* Broken parent link. */
    uint32_t l = chunk_at(&store, root)->left;
    chunk_at(&store, l)->parent = l;
    CHECK(tree_validate(&store, root, sink) < 0);
    chunk_at(&store, l)->parent = root;
    CHECK(tree_validate(&store, root, sink) == 5);
    fclose(sink);
    chunk_store_fini(&store);
}

int main(void)
{
    RUN(random_inserts_and_removes_keep_order);
    RUN(validator_catches_broken_trees);
    return harness_result();
}
