/*
 * cudart_link.c - see cudart_link.h.
 *
 * A program linked against the shared runtime names libcudart.so.N in its
 * dynamic section (DT_NEEDED). One linked statically names none, but
 * carries the runtime's own strings; "cudaErrorCudartUnloading" (the name
 * cudaGetErrorName gives one of the runtime's error codes, which only the
 * runtime's table holds) is the one looked for: a program that merely uses
 * the runtime, or the driver, has no reason to contain it. The file is
 * mapped, not read through: an executable with the runtime inside is
 * hundreds of KiB to gigabytes, and the search costs one pass.
 */
#include <elf.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cudart_link.h"

static const char MARKER[] = "cudaErrorCudartUnloading";

/* execvp's search: cmd itself when it names a path, else the first
 * executable regular file of that name along PATH. */
static bool resolve(const char *cmd, char *path, size_t len)
{
    struct stat st;
    if (strchr(cmd, '/'))
        return snprintf(path, len, "%s", cmd) < (int)len;
    const char *dirs = getenv("PATH");
    if (!dirs || !*dirs)
        dirs = "/usr/local/bin:/usr/bin:/bin";
    while (*dirs) {
        size_t n = strcspn(dirs, ":");
        if (snprintf(path, len, "%.*s%s%s", (int)n, n ? dirs : ".", "/", cmd) < (int)len &&
            stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return true;
        dirs += n + (dirs[n] == ':');
    }
    return false;
}

/* Does [off, off + n) lie inside a file of `size` bytes? */
static bool inside(uint64_t off, uint64_t n, uint64_t size)
{
    return off <= size && n <= size - off;
}

/* True when the ELF image's dynamic section names libcudart.so*. */
static bool needs_cudart(const unsigned char *f, uint64_t size)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
    if (eh->e_shentsize != sizeof(Elf64_Shdr) ||
        !inside(eh->e_shoff, (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr), size))
        return false;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNAMIC || sh[i].sh_link >= eh->e_shnum)
            continue;
        const Elf64_Shdr *str = &sh[sh[i].sh_link];
        if (!inside(sh[i].sh_offset, sh[i].sh_size, size) ||
            !inside(str->sh_offset, str->sh_size, size))
            return false;
        const Elf64_Dyn *d = (const Elf64_Dyn *)(f + sh[i].sh_offset);
        for (uint64_t k = 0; k < sh[i].sh_size / sizeof *d && d[k].d_tag != DT_NULL; k++) {
            if (d[k].d_tag != DT_NEEDED || d[k].d_un.d_val >= str->sh_size)
                continue;
            const char *name = (const char *)f + str->sh_offset + d[k].d_un.d_val;
            size_t room = (size_t)(str->sh_size - d[k].d_un.d_val);
            if (strnlen(name, room) < room && strncmp(name, "libcudart.so", 12) == 0)
                return true;
        }
    }
    return false;
}

cudart_link cudart_link_of(const char *cmd, char *path, size_t len)
{
    if (!resolve(cmd, path, len))
        return CUDART_UNKNOWN;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return CUDART_UNKNOWN;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)sizeof(Elf64_Ehdr)) {
        close(fd);
        return CUDART_UNKNOWN;
    }
    const uint64_t size = (uint64_t)st.st_size;
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return CUDART_UNKNOWN;
    const unsigned char *f = map;
    cudart_link how = CUDART_UNKNOWN;
    if (memcmp(f, ELFMAG, SELFMAG) == 0 && f[EI_CLASS] == ELFCLASS64)
        how = needs_cudart(f, size)                          ? CUDART_SHARED
              : memmem(f, (size_t)size, MARKER, sizeof MARKER - 1) ? CUDART_STATIC
                                                                   : CUDART_NONE;
    munmap(map, (size_t)size);
    return how;
}
