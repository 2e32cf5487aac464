/* hooks.h - the driver entry points the shim interposes, by name and by the
 * real function they stand in for (procaddr.c). */
#ifndef BFCSHIM_LIB_HOOKS_H
#define BFCSHIM_LIB_HOOKS_H

/* Our export for a driver symbol name, or NULL if we do not interpose it. */
void *hook_by_name(const char *name);
/* Our export standing in for a real driver function pointer, or `real`
 * itself when we do not interpose it. */
void *hook_by_real(void *real);

#endif
