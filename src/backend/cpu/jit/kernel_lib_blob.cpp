// The kernel library's bitcode (kernel_lib.cpp, compiled by the build), embedded as read-only
// data between lazyrt_jit_kernel_lib and lazyrt_jit_kernel_lib_end.
asm(".section .rodata\n"
    ".balign 16\n"
    ".globl lazyrt_jit_kernel_lib\n"
    "lazyrt_jit_kernel_lib:\n"
    ".incbin \"" LAZYRT_KERNEL_LIB_BC "\"\n"
    ".globl lazyrt_jit_kernel_lib_end\n"
    "lazyrt_jit_kernel_lib_end:\n"
    ".byte 0\n"
    ".previous\n");
