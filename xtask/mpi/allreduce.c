/* The host-based baseline of `cargo xtask bench`: MPI_Allreduce (sum of int32) on the same
 * data as the switch runs (member m's element i = (int32) splitmix64(seed ^ m << 40 ^ i)),
 * timed the same way: from a common start (a barrier) until the rank's result is in its
 * buffer; the run's time is the slowest rank's. Verification runs after the clock stops.
 * Usage: allreduce BYTES ITERATIONS SEED. Rank 0 prints one JSON object. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int32_t element(uint64_t seed, int member, size_t i) {
    return (int32_t)(uint32_t)mix(seed ^ ((uint64_t)member << 40) ^ (uint64_t)i);
}

/* Machine-wide busy time in seconds (/proc/stat: all but idle and iowait; softirq, where
 * the kernel's network work runs, included). */
static double busy_seconds(void) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
        if (f) fclose(f);
        return 0;
    }
    fclose(f);
    return (double)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / 100.0;
}

/* Bytes this rank's network namespace sent on eth0. */
static unsigned long long tx_bytes(void) {
    unsigned long long b = 0;
    FILE *f = fopen("/sys/class/net/eth0/statistics/tx_bytes", "r");
    if (f) {
        if (fscanf(f, "%llu", &b) != 1) b = 0;
        fclose(f);
    }
    return b;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4) {
        if (rank == 0) fprintf(stderr, "usage: %s BYTES ITERATIONS SEED\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t n = strtoull(argv[1], 0, 10) / 4;
    int iters = atoi(argv[2]);
    uint64_t seed = strtoull(argv[3], 0, 10);
    int32_t *data = malloc(n * 4), *buf = malloc(n * 4), *first = malloc(n * 4);
    for (size_t i = 0; i < n; i++) data[i] = element(seed, rank, i);
    double *times = calloc(iters, sizeof(double));
    int ok = 1;
    MPI_Barrier(MPI_COMM_WORLD);
    double busy0 = busy_seconds();
    unsigned long long tx0 = tx_bytes();
    for (int it = 0; it < iters; it++) {
        memcpy(buf, data, n * 4);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        double t = MPI_Wtime() - t0;
        double slowest;
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        times[it] = slowest;
        if (it == 0) memcpy(first, buf, n * 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double busy = busy_seconds() - busy0;
    double tx = (double)(tx_bytes() - tx0), tx_sum;
    /* Verification after every clock has stopped. */
    for (size_t i = 0; i < n && ok; i++) {
        uint32_t want = 0;
        for (int m = 0; m < size; m++) want += (uint32_t)element(seed, m, i);
        ok = (uint32_t)first[i] == want;
    }
    int all_ok;
    MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
    MPI_Reduce(&tx, &tx_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("{\"ranks\":%d,\"bytes\":%zu,\"verified\":%s,\"busy_seconds\":%.3f,\"tx_bytes_per_rank\":%.0f,\"seconds\":[",
               size, n * 4, all_ok ? "true" : "false", busy, tx_sum / size);
        for (int it = 0; it < iters; it++) printf("%s%.9f", it ? "," : "", times[it]);
        printf("]}\n");
    }
    MPI_Finalize();
    return 0;
}
