/*
 * opened_only.c - the body of the empty CUDA 12 math libraries (cuBLAS,
 * cuBLASLt, cuFFT, cuSOLVER, cuSPARSE, cuDNN) that TensorFlow 2.21 must be
 * able to dlopen before it registers a GPU. TensorFlow only opens them at
 * that point; a test that puts, gets and copies tensors calls nothing in
 * them, so a library with the right soname and no functions is enough, and
 * a call that did reach one would fail loudly (undefined symbol) instead of
 * computing something wrong.
 */

/* ISO C wants one declaration in a translation unit. */
typedef int bfcshim_opened_only;
