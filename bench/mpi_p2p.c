/* The Open MPI side of bench/compare-ucx.sh: point-to-point between two ranks, measured
 * the way hmc-probe measures a pair, printed on rank 0 (the figure, then the libucp).
 *
 *   mpirun -np 2 mpi_p2p bw SIZE N     one-way stream of N SIZE-byte messages, GB/s (1e9 B/s)
 *   mpirun -np 2 mpi_p2p lat N WARMUP  8-byte ping-pong, half a round trip in us
 *
 * bw: rank 0 sends with MPI_Isend, rank 1 receives with MPI_Irecv, 4 in flight (the oldest
 * waited for before the next is posted), every message from and into one buffer; a warm-up
 * round of N/10 (at least 2) first; the time runs on rank 0 from its first send until rank
 * 1's one-byte acknowledgement of the last message came. lat: each side posts its receive
 * before it sends (MPI_Irecv, MPI_Send, MPI_Wait), WARMUP untimed round trips first.
 * Afterwards one message of SIZE (lat: 8) bytes of known content is sent and checked;
 * a wrong byte fails the run (exit 1). Rank 0 prints the figure, then the path of the
 * UCX library (libucp) the process has mapped, so a run can show which UCX it measured. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "size_arg.h"

enum { kWindow = 4, kDataTag = 11, kAckTag = 12, kCheckTag = 13 };

/* n messages of `bytes`, kWindow in flight; the receiver acknowledges the last. */
static void stream(int rank, char* buf, size_t bytes, long n) {
  MPI_Request reqs[kWindow];
  char ack = 0;
  for (long i = 0; i < n; ++i) {
    MPI_Request* r = &reqs[i % kWindow];
    if (i >= kWindow) MPI_Wait(r, MPI_STATUS_IGNORE);
    if (rank == 0) MPI_Isend(buf, (int)bytes, MPI_BYTE, 1, kDataTag, MPI_COMM_WORLD, r);
    else MPI_Irecv(buf, (int)bytes, MPI_BYTE, 0, kDataTag, MPI_COMM_WORLD, r);
  }
  MPI_Waitall(n < kWindow ? (int)n : kWindow, reqs, MPI_STATUSES_IGNORE);
  if (rank == 0) MPI_Recv(&ack, 1, MPI_BYTE, 1, kAckTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  else MPI_Send(&ack, 1, MPI_BYTE, 0, kAckTag, MPI_COMM_WORLD);
}

static void pingpong(int rank, long n) {
  uint64_t in = 0, out = 0;
  const int peer = 1 - rank;
  for (long i = 0; i < n; ++i) {
    MPI_Request r;
    MPI_Irecv(&in, 8, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD, &r);
    if (rank == 0) {
      MPI_Send(&out, 8, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD);
      MPI_Wait(&r, MPI_STATUS_IGNORE);
    } else {
      MPI_Wait(&r, MPI_STATUS_IGNORE);
      MPI_Send(&out, 8, MPI_BYTE, peer, kDataTag, MPI_COMM_WORLD);
    }
  }
}

/* The libucp this process mapped (Open MPI's UCX layer loads it), or "-". */
static void ucp_path(char* out, size_t cap) {
  snprintf(out, cap, "-");
  FILE* maps = fopen("/proc/self/maps", "r");
  if (!maps) return;
  char line[4096];
  while (fgets(line, sizeof line, maps)) {
    const char* path = strchr(line, '/');
    if (path && strstr(path, "/libucp.so")) {
      snprintf(out, cap, "%s", path);
      out[strcspn(out, "\n")] = 0;
      break;
    }
  }
  fclose(maps);
}

/* One message of known bytes from rank 0 to rank 1; rank 1 counts the wrong ones. */
static long check(int rank, char* buf, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i) buf[i] = rank == 0 ? (char)(i * 7 + 3) : (char)0xa5;
  if (rank == 0) {
    MPI_Send(buf, (int)bytes, MPI_BYTE, 1, kCheckTag, MPI_COMM_WORLD);
    return 0;
  }
  MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, kCheckTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  long wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += buf[i] != (char)(i * 7 + 3);
  return wrong;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int bw = argc == 4 && strcmp(argv[1], "bw") == 0, lat = argc == 4 && strcmp(argv[1], "lat") == 0;
  size_t bytes = 8;
  long n = 0, warmup = 0;
  if (bw) n = parse_size(argv[2], &bytes) ? atol(argv[3]) : 0;
  if (lat) n = atol(argv[2]), warmup = atol(argv[3]);
  if (size != 2 || n <= 0 || warmup < 0) {
    if (rank == 0)
      fprintf(stderr, "usage: mpirun -np 2 mpi_p2p bw SIZE N | lat N WARMUP (%d ranks given)\n", size);
    MPI_Finalize();
    return 2;
  }
  char* buf = malloc(bytes);
  if (!buf) MPI_Abort(MPI_COMM_WORLD, 2);
  memset(buf, 1, bytes);
  double result = 0;
  if (bw) {
    stream(rank, buf, bytes, n / 10 > 2 ? n / 10 : 2);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    stream(rank, buf, bytes, n);
    result = (double)bytes * (double)n / (MPI_Wtime() - t0) / 1e9;
  } else {
    pingpong(rank, warmup);
    const double t0 = MPI_Wtime();
    pingpong(rank, n);
    result = (MPI_Wtime() - t0) / (double)n / 2 * 1e6;
  }
  long wrong = check(rank, buf, bytes);
  MPI_Bcast(&wrong, 1, MPI_LONG, 1, MPI_COMM_WORLD);
  if (rank == 0) {
    if (wrong) fprintf(stderr, "mpi_p2p: %ld of %zu bytes arrived wrong\n", wrong, bytes);
    else {
      char lib[4096];
      ucp_path(lib, sizeof lib);
      printf("%.6f %s\n", result, lib);  /* 6 places: 8 B x 400 on a loaded host is under 0.0005 GB/s */
    }
  }
  free(buf);
  MPI_Finalize();
  return wrong ? 1 : 0;
}
