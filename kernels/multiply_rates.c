// Throughput of the integer multiply instructions the q8 kernel uses, at 256 and 512 bits, on
// one thread: 12 independent accumulator chains of one instruction, billions a second.
//   gcc -O2 kernels/multiply_rates.c -o /tmp/multiply_rates && for k in 0 1 2 3 4 5 6 7; do
//     /tmp/multiply_rates 200000000 $k; done
// (Needs AVX-512 VNNI and BW: the instructions are written in assembly.)
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

#define R12(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define DPBUSD_Y(i) "vpdpbusd %%ymm13, %%ymm14, %%ymm" #i "\n"
#define DPWSSD_Y(i) "vpdpwssd %%ymm13, %%ymm14, %%ymm" #i "\n"
#define MADDUBS_Y(i) "vpmaddubsw %%ymm13, %%ymm14, %%ymm" #i "\n"
#define PADDD_Y(i) "vpaddd %%ymm13, %%ymm" #i ", %%ymm" #i "\n"
#define FMA_Y(i) "vfmadd231ps %%ymm13, %%ymm14, %%ymm" #i "\n"
#define DPBUSD_Z(i) "vpdpbusd %%zmm13, %%zmm14, %%zmm" #i "\n"
#define DPWSSD_Z(i) "vpdpwssd %%zmm13, %%zmm14, %%zmm" #i "\n"
#define MADDUBS_Z(i) "vpmaddubsw %%zmm13, %%zmm14, %%zmm" #i "\n"
#define LOOP(body) for (long k = 0; k < n; k++) __asm__ volatile(R12(body) ::: "memory");

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s ITERATIONS KIND (0-7)\n", argv[0]);
    return 2;
  }
  const long n = atol(argv[1]);
  const int kind = atoi(argv[2]);
  static const char* names[] = {"vpdpbusd ymm", "vpdpwssd ymm", "vpmaddubsw ymm", "vpaddd ymm",
                                "vfmadd231ps ymm", "vpdpbusd zmm", "vpdpwssd zmm",
                                "vpmaddubsw zmm"};
  if (kind < 0 || kind > 7) {
    fprintf(stderr, "KIND must be 0-7, got %d\n", kind);
    return 2;
  }
  const double t0 = now();
  switch (kind) {
    case 0: LOOP(DPBUSD_Y) break;
    case 1: LOOP(DPWSSD_Y) break;
    case 2: LOOP(MADDUBS_Y) break;
    case 3: LOOP(PADDD_Y) break;
    case 4: LOOP(FMA_Y) break;
    case 5: LOOP(DPBUSD_Z) break;
    case 6: LOOP(DPWSSD_Z) break;
    case 7: LOOP(MADDUBS_Z) break;
  }
  const double t = now() - t0;
  printf("%-18s %.2f G/s\n", names[kind], n * 12 / t / 1e9);
  return 0;
}
