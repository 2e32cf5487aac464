/*
 * out_file.h - opening the files the shim and the bfcshim command write,
 * safely in a directory that another local user can write too (a shared
 * /tmp): a symbolic link planted at an output's name, or at the name of
 * its temporary, is never followed, so such a user cannot make a job
 * overwrite or append to a file the job can write and they cannot.
 */
#ifndef BFCSHIM_COMMON_OUT_FILE_H
#define BFCSHIM_COMMON_OUT_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* Opens path for writing, created (mode 0644 less the umask) if absent;
 * how is O_TRUNC or O_APPEND. -1 with errno on failure, ELOOP when path is
 * a symbolic link another user can have planted (one owned by neither us
 * nor root, or leading through such a link); our own links and the
 * system's (/dev/stderr) are followed. The descriptor is close-on-exec. */
int out_file_open(const char *path, int how);

/* The same as a stream: mode "w" or "a". */
FILE *out_file_fopen(const char *path, const char *mode);

/* Creates a new file next to path, named path + suffix + six random
 * characters, that did not exist before (O_EXCL: whatever was planted at a
 * name is skipped, never opened), with mode (less the umask). Its name goes
 * to name (size bytes). -1 with errno on failure. */
int out_file_temp(const char *path, const char *suffix, mode_t mode, char *name, size_t size);

/* Renames the temporary tmp over path, unless path is a symbolic link
 * another user can have planted (false, errno ELOOP; tmp is left for the
 * caller to remove). rename
 * replaces a name and never writes through it, but a link at the name is
 * somebody's doing, and is left for them to see. */
bool out_file_replace(const char *tmp, const char *path);

/* Whether an output made aside and renamed over path (out_file_temp,
 * out_file_replace) must be written in place instead (out_file_open): a
 * link nobody else can have planted, which is followed as out_file_open
 * follows it (/dev/stdout; the rename replaced the link itself), or an
 * existing file that is not a regular one (a FIFO, /dev/null: the rename
 * replaced it with a file, the system's own when run as root). */
bool out_file_in_place(const char *path);

/* Closes f, an output just written (stdout and stderr: flushed only);
 * false with errno when any write to it failed (a full disk). The stream's
 * error flag is read as well as fclose's answer: a write that failed
 * leaves fclose's own flush free to succeed, and an output cut short
 * would pass for a whole one. */
bool out_file_close(FILE *f);

/* A document written in memory (the stats JSON, the OOM report): open it
 * with out_mem_open (an empty out_mem), write, close with out_file_close,
 * whose false says the document is not whole; then free(m->text). A
 * stream of its own, not open_memstream: glibc's memory stream drops a
 * write it finds no memory for without setting the error flag, and its
 * fclose answers 0 when its last realloc fails, the buffer then NULL and
 * the length the last flush's (e2e_api stats-nomem-write). NULL with errno
 * when the stream cannot be made. */
typedef struct out_mem {
    char *text; /* not NUL-terminated */
    size_t len, cap;
} out_mem;
FILE *out_mem_open(out_mem *m);

/* Why writing path failed with err, as words that follow the path in a
 * message: "is a symbolic link", or "cannot be written (strerror)". */
void out_file_why(const char *path, int err, char *buf, size_t size);

/* Whether the folder path would be written in is missing (or is not a
 * folder): true with that folder in folder (size bytes). Writing there
 * fails only when the file is made, which for statistics is at exit: a
 * check at the start lets that be said while somebody is watching. */
bool out_file_folder_missing(const char *path, char *folder, size_t size);

/* Whether path names a folder (one that exists, or any path ending in '/'):
 * a file cannot be made there, which again is found only at the write. */
bool out_file_names_folder(const char *path);

#endif
