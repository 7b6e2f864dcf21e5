/* The Open MPI side of bench/compare-cpu.sh: one collective over a size sweep, timed the
 * way hmc-bench times it, printed as CSV on rank 0.
 *
 *   mpirun -np 4 mpi_bench all_reduce|all_gather|all_to_all -b 8 -e 16M -f 8 -n 20 -w 5
 *
 * Sizes mean what they mean in nccl-tests and hmc-bench: all_reduce sums size/4 floats;
 * all_gather and all_to_all move size bytes in all (size/ranks bytes per block, as bytes).
 * Per size: -w warm-up calls, MPI_Barrier, -n timed calls; time = elapsed/n on every rank,
 * reported as the max over ranks. One more call on known data is then checked. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size_arg.h"

/* Inputs: rank r's element i; all_reduce sums small integers, exact in float. */
static float reduce_in(int r, size_t i) { return (float)((i * 31 + (size_t)r * 17) % 3); }
static uint8_t move_in(int r, size_t i) { return (uint8_t)((size_t)r * 131 + i * 7) % 97; }

static void run(MPI_Comm c, int coll, const void* send, void* recv, size_t count) {
  if (coll == 0) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, c);
  else if (coll == 1) MPI_Allgather(send, (int)count, MPI_BYTE, recv, (int)count, MPI_BYTE, c);
  else MPI_Alltoall(send, (int)count, MPI_BYTE, recv, (int)count, MPI_BYTE, c);
}

static long check(int coll, int rank, int n, void* send, void* recv, size_t count) {
  long wrong = 0;
  if (coll == 0) {
    float* s = send;
    for (size_t i = 0; i < count; ++i) s[i] = reduce_in(rank, i);
    memset(recv, 0xa5, count * sizeof(float));
    run(MPI_COMM_WORLD, coll, send, recv, count);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += reduce_in(r, i);
      wrong += ((float*)recv)[i] != want;
    }
    return wrong;
  }
  uint8_t* s = send;
  for (size_t i = 0; i < count * (coll == 1 ? 1 : n); ++i) s[i] = move_in(rank, i);
  memset(recv, 0xa5, count * n);
  run(MPI_COMM_WORLD, coll, send, recv, count);
  for (int j = 0; j < n; ++j)
    for (size_t i = 0; i < count; ++i)
      wrong += ((uint8_t*)recv)[j * count + i] != move_in(j, coll == 1 ? i : rank * count + i);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  static const char* names[] = {"all_reduce", "all_gather", "all_to_all"};
  int coll = -1, iters = 20, warmup = 5;
  size_t min_b = 8, max_b = 8, factor = 2;
  for (int a = 1; a < argc; ++a) {
    const char* v = a + 1 < argc ? argv[a + 1] : "";
    int ok = 1;
    if (!strcmp(argv[a], "-b")) ok = parse_size(v, &min_b), ++a;
    else if (!strcmp(argv[a], "-e")) ok = parse_size(v, &max_b), ++a;
    else if (!strcmp(argv[a], "-f")) ok = parse_size(v, &factor) && factor >= 2, ++a;
    else if (!strcmp(argv[a], "-n")) ok = (iters = atoi(v)) > 0, ++a;
    else if (!strcmp(argv[a], "-w")) ok = (warmup = atoi(v)) >= 0, ++a;
    else {
      ok = 0;
      for (int c = 0; c < 3; ++c)
        if (!strcmp(argv[a], names[c])) coll = c, ok = 1;
    }
    if (!ok) {
      if (rank == 0) fprintf(stderr, "mpi_bench: bad argument '%s'\n", argv[a]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  if (coll < 0) {
    if (rank == 0) fprintf(stderr, "usage: mpi_bench all_reduce|all_gather|all_to_all -b MIN -e MAX -f F -n N -w W\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char* send = malloc(max_b > 64 ? max_b : 64);
  char* recv = malloc(max_b > 64 ? max_b : 64);
  memset(send, 1, max_b);
  memset(recv, 0, max_b);
  if (rank == 0) printf("collective,ranks,size,count,time_us,wrong\n");
  long wrong_total = 0;
  for (size_t bytes = min_b; bytes <= max_b; bytes *= factor) {
    size_t count = coll == 0 ? bytes / sizeof(float) : bytes / n;
    size_t size = coll == 0 ? count * sizeof(float) : count * n;
    for (int i = 0; i < warmup; ++i) run(MPI_COMM_WORLD, coll, send, recv, count);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) run(MPI_COMM_WORLD, coll, send, recv, count);
    double mine = (MPI_Wtime() - t0) / iters * 1e6, worst = 0;
    long wrong = check(coll, rank, n, send, recv, count), wrong_sum = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_sum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    wrong_total += wrong_sum;
    if (rank == 0) printf("%s,%d,%zu,%zu,%.3f,%ld\n", names[coll], n, size, count, worst, wrong_sum);
    fflush(stdout);
    if (bytes > max_b / factor) break;
  }
  free(send);
  free(recv);
  MPI_Finalize();
  return rank == 0 && wrong_total ? 1 : 0;
}
