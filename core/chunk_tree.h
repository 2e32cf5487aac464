/*
 * chunk_tree.h - an intrusive red-black tree of chunk handles ordered by
 * (size, address).
 *
 * Each bin of free chunks is one such tree, so "best fit" inside a bin is a
 * lower-bound search and "lowest address among equal sizes" falls out of the
 * key order. The links (left, right, parent, red) live in the chunk records
 * themselves, so the tree allocates nothing. Record 0 of the store is the
 * black sentinel (CLRS style): it removes every null test from the rotations;
 * the delete fix-up writes its parent link, which nothing else reads.
 */
#ifndef BFCSHIM_CORE_CHUNK_TREE_H
#define BFCSHIM_CORE_CHUNK_TREE_H

#include <stddef.h>
#include <stdio.h>

#include "chunks.h"

void tree_insert(chunk_store *s, uint32_t *root, uint32_t z);
void tree_remove(chunk_store *s, uint32_t *root, uint32_t z);
/* Puts node `by` (not in any tree) exactly where `old` is, colour and all,
 * and detaches `old`. The caller guarantees that by's key sorts where old's
 * did: no rebalancing happens. */
void tree_replace(chunk_store *s, uint32_t *root, uint32_t old, uint32_t by);

/* The smallest node with size >= `size` (lowest address among equals), or
 * CHUNK_NIL. */
uint32_t tree_lower_bound(const chunk_store *s, uint32_t root, uint64_t size);

uint32_t tree_first(const chunk_store *s, uint32_t root);
uint32_t tree_last(const chunk_store *s, uint32_t root);
/* In-order successor / predecessor, or CHUNK_NIL. */
uint32_t tree_next(const chunk_store *s, uint32_t x);
uint32_t tree_prev(const chunk_store *s, uint32_t x);

/* Checks order, colours, black height and parent links. Returns the number of
 * nodes, or -1 after describing the first violation on err (if not NULL). */
long tree_validate(const chunk_store *s, uint32_t root, FILE *err);

#endif
