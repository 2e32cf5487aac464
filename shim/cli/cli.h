/* cli.h - the bfcshim command's subcommands and their shared helpers. */
#ifndef BFCSHIM_CLI_CLI_H
#define BFCSHIM_CLI_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bfc.h"
#include "sim_device.h"
#include "trace_csv.h"

int cmd_run(int argc, char **argv);
int cmd_ab(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_report(int argc, char **argv);
int cmd_plan(int argc, char **argv);

/* A pool of exactly `pool_bytes` in one preallocated region of a fresh
 * simulated device, with the policy's placement and split rules, as replay
 * measures them (no garbage collection: one region is all there is). The
 * backend's region functions are filled in; its hooks (on_event) are the
 * caller's. NULL if it cannot be made. (replay.c) */
struct sim_device;
bfc_pool *replay_pool_create(struct sim_device *dev, const bfc_options *policy,
                             uint64_t pool_bytes, bfc_backend *backend);

/* The smallest multiple of `unit`, from the one below `peak` up to `cap`,
 * for which serves(ctx, bytes) holds: up from the peak by a growing step,
 * then bisected. Bisection assumes a larger size never serves less, which
 * holds for best fit in practice though not in theory: the answer is the
 * smallest size found that works. 0 when peak is 0 or at least
 * BFC_SIZE_LIMIT, or cap does not serve (replay.c). */
uint64_t cli_smallest_serving(uint64_t peak, uint64_t unit, uint64_t cap,
                              bool (*serves)(void *ctx, uint64_t bytes), void *ctx);

/* Replays trace t into `pool` until an allocation fails, then writes to f
 * which one and the pool's memory map (`what` of `size` bytes names the
 * pool in that line); nothing when every allocation succeeds (replay.c). */
void replay_dump_first_failure(bfc_pool *pool, const trace *t, bfc_addr *slot_addr,
                               const char *what, uint64_t size, FILE *f);
/* Replays events [from, to) of t into pool (slot_addr: each slot's block);
 * returns the allocations that failed (replay.c). */
uint64_t replay_loop(bfc_pool *pool, const trace *t, size_t from, size_t to,
                     bfc_addr *slot_addr);

/* How the frees of replay_lagging reach the pool: each its own fence
 * (bfc_pool_free_fenced, the event's index as token), or deferred into the
 * lane and fenced as the pool seals (bfc_pool_free_deferred, as the shim's
 * plain frees). */
typedef enum lagging_frees { FREES_FENCED, FREES_DEFERRED } lagging_frees;

/* replay_loop on a GPU running dev->gpu_lag events behind, the frees going
 * to `lane` as `how` says; the simulated device's clock is the event index
 * (replay.c). replay_loop's twin, kept apart so that the loop replay times
 * and callgrind counts stays as it is. */
uint64_t replay_lagging(bfc_pool *pool, sim_device *dev, uint32_t lane, lagging_frees how,
                        const trace *t, size_t from, size_t to, bfc_addr *slot_addr);

/* The smallest single region, to 1 MiB, that serves the trace (replay.c). */
uint64_t replay_min_pool_bytes(const trace *t, const bfc_options *policy);
/* TSL's BFC policy (replay --tsl, report --compare tsl): lowest-address
 * placement, and a chunk split only when the rest is at least as large as
 * the request or 128 MiB (replay.c). */
void cli_policy_tsl(bfc_options *policy);
int cmd_tracegen(int argc, char **argv);

/* One line for an option getopt_long refused (opterr = 0, ':' leading the
 * option string, c what it returned): the unknown option, or the one
 * without its value, and where the list is, rather than the whole help,
 * whose first lines are all a terminal shows. Returns 2. */
int cli_bad_option(const char *cmd, char **argv, int c);

/* "bfcshim CMD: OPTION 'VALUE' is not ACCEPTED" on stderr; returns 2. */

int cli_bad_value(const char *cmd, const char *option, const char *value,
                  const char *accepted);

/* "bfcshim CMD: PATH is a symbolic link" (out_file_why's words for err) on
 * stderr, for an output that could not be opened. */
void cli_cannot_write(const char *cmd, const char *path, int err);

/* Whether path can be made as an output file: not a folder (one that
 * exists, or a path ending in '/'), not in a missing folder; else one line
 * saying so on stderr and false, before the command does any work ("-":
 * stdout or stderr, fine). */
bool cli_output_place_ok(const char *cmd, const char *option, const char *path);

/* "--name" of the long option whose val is `val`. */
const char *cli_option_name(const struct option *opts, int val);

#endif
