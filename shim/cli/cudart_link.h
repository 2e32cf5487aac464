/*
 * cudart_link.h - how a program carries the CUDA runtime, read from its
 * file before `bfcshim run` or `ab` start it.
 *
 * nvcc links the runtime statically by default (-cudart static): the
 * runtime is then inside the executable, reaches the driver through
 * private tables (cuGetExportTable) and never calls the exported
 * cudaMalloc the shim's runtime door interposes. On a GPU the driver door
 * still serves its allocations; on the fake GPU, which cannot serve those
 * tables, every runtime call fails with 801 "operation not supported";
 * with the driver door closed, nothing of it is pooled. Worth one line
 * before the program starts, so the reader need not guess why.
 */
#ifndef BFCSHIM_CLI_CUDART_LINK_H
#define BFCSHIM_CLI_CUDART_LINK_H

#include <stddef.h>

typedef enum cudart_link {
    CUDART_UNKNOWN, /* not found, not a 64-bit ELF file, or unreadable */
    CUDART_NONE,    /* no CUDA runtime of its own (a driver-API program, a tool) */
    CUDART_SHARED,  /* libcudart.so.* among its DT_NEEDED libraries */
    CUDART_STATIC,  /* none needed, but the runtime's own strings inside */
} cudart_link;

/* How `cmd` (a path, or a name looked up in PATH as execvp does) carries
 * the CUDA runtime; the file that was read goes to path (when found). Only
 * the executable is read: a runtime linked into one of its libraries is
 * left to the fake driver, which names it when it is asked for the
 * private tables. */
cudart_link cudart_link_of(const char *cmd, char *path, size_t len);

#endif
