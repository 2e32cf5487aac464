/*
 * dlsym_x86_64.S - the exported dlsym: asks bfcshim_dlsym_target(handle,
 * symbol, return address) where to go, then jumps there with the original
 * arguments and stack, so that the real dlsym sees our caller as its caller
 * (RTLD_NEXT depends on it). See dlsym_hook.c.
 */
    .text
    .globl dlsym
    .type dlsym, @function
dlsym:
    .cfi_startproc
    pushq %rdi                  /* handle */
    .cfi_adjust_cfa_offset 8
    pushq %rsi                  /* symbol */
    .cfi_adjust_cfa_offset 8
    movq 16(%rsp), %rdx         /* our caller's return address */
    subq $8, %rsp               /* 16-byte alignment for the call */
    .cfi_adjust_cfa_offset 8
    call bfcshim_dlsym_target
    addq $8, %rsp
    .cfi_adjust_cfa_offset -8
    popq %rsi
    .cfi_adjust_cfa_offset -8
    popq %rdi
    .cfi_adjust_cfa_offset -8
    jmp *%rax
    .cfi_endproc
    .size dlsym, .-dlsym
    .section .note.GNU-stack,"",@progbits
