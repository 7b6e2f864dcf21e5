/* A size as the bench programs' arguments give it (mpi_bench.c, mpi_p2p.c): a number
 * with an optional K, M or G (powers of 1024). 0 for anything else and for sizes above
 * 1 GiB (MPI takes int counts); 1 with *out set. */
#ifndef HMC_BENCH_SIZE_ARG_H
#define HMC_BENCH_SIZE_ARG_H
#include <stddef.h>
#include <stdlib.h>

static int parse_size(const char* text, size_t* out) {
  char* end = NULL;
  double v = strtod(text, &end);
  if (end == text || v <= 0) return 0;
  double mul = 1;
  switch (*end) {
    case 'k': case 'K': mul = 1024.0; ++end; break;
    case 'm': case 'M': mul = 1024.0 * 1024; ++end; break;
    case 'g': case 'G': mul = 1024.0 * 1024 * 1024; ++end; break;
    default: break;
  }
  if (*end || v * mul > 1024.0 * 1024 * 1024) return 0;
  *out = (size_t)(v * mul);
  return 1;
}

#endif
