/*
 * dlsym_aarch64.S - the exported dlsym: asks bfcshim_dlsym_target(handle,
 * symbol, return address) where to go, then branches there with the original
 * arguments and link register, so that the real dlsym sees our caller as its
 * caller (RTLD_NEXT depends on it). See dlsym_hook.c.
 */
    .text
    .globl dlsym
    .type dlsym, %function
dlsym:
    stp x29, x30, [sp, #-32]!
    mov x29, sp
    stp x0, x1, [sp, #16]
    mov x2, x30                 /* our caller's return address */
    bl bfcshim_dlsym_target
    mov x16, x0
    ldp x0, x1, [sp, #16]
    ldp x29, x30, [sp], #32
    br x16
    .size dlsym, .-dlsym
    .section .note.GNU-stack,"",%progbits
