/* The host-based baseline of `cargo xtask bench`: MPI_Allreduce (sum of int32) on the same
 * data as the switch runs (member m's element i = (int32) splitmix64(seed ^ m << 40 ^ i)),
 * timed the same way: from a common start (a barrier) until the rank's result is in its
 * buffer; the run's time is the slowest rank's. Verification runs after the clock stops.
 * With a fourth argument `cpu`, each rank also reads the machine's CPU counters right before
 * and right after its timed part, and rank 0 prints each allreduce's window: from the
 * earliest start to the latest end over the ranks (the counters only grow, so the minimum
 * of the starts and the maximum of the ends), the same way the bench merges the switch
 * workers' windows.
 * Then the same allreduce timed as osu_allreduce does (OSU micro-benchmarks): each rank
 * times each call alone, after a warm-up, with a barrier between calls, 1000 calls up to
 * 8 KiB and 100 above (warm-up 200 and 10) — here at most ITERATIONS above 1 MiB, to keep
 * the bench's time — and the latency is the mean over the ranks of each rank's mean
 * (`osu_us`).
 * Last, ITERATIONS calls back to back, as the switch's own workers (`xagg allreduce
 * --repeat`) time theirs: each rank times each call from the end of its previous one, with
 * no barrier between them, and each call's time is its slowest rank's (`back_to_back`):
 * the figure the drop-in's time over the switch path alone compares like with like.
 * With BENCH_COLLECTIVE in the environment (reduce_scatter, all_gather, broadcast,
 * reduce), every timed call is that collective over the same BYTES instead (the
 * message: all the blocks of a reduce-scatter or all-gather; root 0), each checked.
 * With BENCH_DTYPE=float32 or float64 the elements are MPI_FLOAT or MPI_DOUBLE instead:
 * small integers (member m's element i = splitmix64(...) % 33 - 16), whose sums are exact
 * in every order, so that every result is still checked exactly; BYTES stays the message.
 * Usage: allreduce BYTES ITERATIONS SEED [cpu]. Rank 0 prints one JSON object. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int32_t element(uint64_t seed, int member, size_t i) {
    return (int32_t)(uint32_t)mix(seed ^ ((uint64_t)member << 40) ^ (uint64_t)i);
}

/* The elements' type (BENCH_DTYPE): int32, float32 or float64, and its size. */
enum { INT32, FLOAT32, FLOAT64 };
static int dtype = INT32;
static size_t width = 4;
static MPI_Datatype mpi_type(void) { return dtype == FLOAT64 ? MPI_DOUBLE : dtype == FLOAT32 ? MPI_FLOAT : MPI_INT; }

/* Member m's element i as a double: an int32's value, or a small integer for the floats. */
static double value(uint64_t seed, int member, size_t i) {
    uint64_t z = mix(seed ^ ((uint64_t)member << 40) ^ (uint64_t)i);
    return dtype == INT32 ? (double)(int32_t)(uint32_t)z : (double)(int64_t)(z % 33) - 16.0;
}

/* Element i of `buf` written as, or read as a double from, the elements' type. */
static void put(void *buf, size_t i, double v) {
    if (dtype == FLOAT64) ((double *)buf)[i] = v;
    else if (dtype == FLOAT32) ((float *)buf)[i] = (float)v;
    else ((int32_t *)buf)[i] = (int32_t)v;
}
static double get(const void *buf, size_t i) {
    /* Each arm a double of its own (a conditional of float and int32 would be a float). */
    if (dtype == FLOAT64) return ((const double *)buf)[i];
    if (dtype == FLOAT32) return (double)((const float *)buf)[i];
    return (double)((const int32_t *)buf)[i];
}

/* One reading for a CPU window: wall clock (ns since the epoch, the same clock in every
 * namespace), then /proc/stat's user+nice, system, irq+softirq (clock ticks). */
enum { WALL, USER, SYSTEM, SOFTIRQ, FIELDS };
static void cpu_sample(unsigned long long out[FIELDS]) {
    unsigned long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (f) {
        if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) != 8)
            memset(v, 0, sizeof v);
        fclose(f);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    out[WALL] = (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
    out[USER] = v[0] + v[1];
    out[SYSTEM] = v[2];
    out[SOFTIRQ] = v[5] + v[6];
}

/* Bytes this rank's network namespace sent or received (`tx` or `rx`) on eth0. */
static unsigned long long link_bytes(const char *way) {
    unsigned long long b = 0;
    char path[64];
    snprintf(path, sizeof path, "/sys/class/net/eth0/statistics/%s_bytes", way);
    FILE *f = fopen(path, "r");
    if (f) {
        if (fscanf(f, "%llu", &b) != 1) b = 0;
        fclose(f);
    }
    return b;
}
static unsigned long long tx_bytes(void) { return link_bytes("tx"); }

enum { ALLREDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, REDUCE };
static int which = ALLREDUCE, rank, size;

/* The timed call over `n` elements: from `in` into `out` (a broadcast in `out`, which the
 * root filled). */
static void call(char *in, char *out, size_t n) {
    int b = (int)(n / size);
    MPI_Datatype t = mpi_type();
    switch (which) {
    case REDUCE_SCATTER: MPI_Reduce_scatter_block(in, out, b, t, MPI_SUM, MPI_COMM_WORLD); break;
    case ALL_GATHER: MPI_Allgather(in + (size_t)rank * b * width, b, t, out, b, t, MPI_COMM_WORLD); break;
    case BROADCAST: MPI_Bcast(out, (int)n, t, 0, MPI_COMM_WORLD); break;
    case REDUCE: MPI_Reduce(in, out, (int)n, t, MPI_SUM, 0, MPI_COMM_WORLD); break;
    default: MPI_Allreduce(in, out, (int)n, t, MPI_SUM, MPI_COMM_WORLD);
    }
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    const char *names[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast", "reduce"};
    const char *chosen = getenv("BENCH_COLLECTIVE");
    for (int k = 0; chosen && k < 5; k++)
        if (strcmp(chosen, names[k]) == 0) which = k;
    const char *type = getenv("BENCH_DTYPE");
    if (type && strcmp(type, "float32") == 0) dtype = FLOAT32;
    if (type && strcmp(type, "float64") == 0) dtype = FLOAT64, width = 8;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "cpu") == 0)) {
        if (rank == 0) fprintf(stderr, "usage: %s BYTES ITERATIONS SEED [cpu]\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    size_t n = strtoull(argv[1], 0, 10) / width, bytes = n * width;
    int iters = atoi(argv[2]);
    uint64_t seed = strtoull(argv[3], 0, 10);
    char *data = malloc(bytes), *buf = malloc(bytes), *first = malloc(bytes);
    for (size_t i = 0; i < n; i++) put(data, i, value(seed, rank, i));
    double *times = calloc(iters, sizeof(double));
    int cpu = argc == 5;
    unsigned long long (*starts)[FIELDS] = calloc(iters, sizeof *starts);
    unsigned long long (*ends)[FIELDS] = calloc(iters, sizeof *ends);
    int ok = 1;
    MPI_Barrier(MPI_COMM_WORLD);
    unsigned long long tx0 = tx_bytes(), rx0 = link_bytes("rx");
    for (int it = 0; it < iters; it++) {
        /* A broadcast's other ranks start from zeros. */
        if (which == BROADCAST && rank != 0)
            memset(buf, 0, bytes);
        else
            memcpy(buf, data, bytes);
        unsigned long long start[FIELDS], end[FIELDS];
        MPI_Barrier(MPI_COMM_WORLD);
        /* Read before the clock starts and after it stops: the readings are outside. */
        if (cpu) cpu_sample(start);
        double t0 = MPI_Wtime();
        if (which == ALLREDUCE)
            MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, mpi_type(), MPI_SUM, MPI_COMM_WORLD);
        else
            call(data, buf, n);
        double t = MPI_Wtime() - t0;
        if (cpu) {
            cpu_sample(end);
            MPI_Reduce(start, starts[it], FIELDS, MPI_UNSIGNED_LONG_LONG, MPI_MIN, 0, MPI_COMM_WORLD);
            MPI_Reduce(end, ends[it], FIELDS, MPI_UNSIGNED_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
        }
        double slowest;
        MPI_Reduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        times[it] = slowest;
        if (it == 0) memcpy(first, buf, bytes);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double tx = (double)(tx_bytes() - tx0), tx_sum;
    double rx = (double)(link_bytes("rx") - rx0), rx_sum;
    /* osu_allreduce's convention. */
    int osu_iters = bytes <= 8192 ? 1000 : 100, osu_skip = bytes <= 8192 ? 200 : 10;
    if (bytes > (1 << 20)) {
        osu_iters = iters < osu_iters ? iters : osu_iters;
        osu_skip = 1;
    }
    double osu_timer = 0, osu_sum = 0;
    for (int it = 0; it < osu_iters + osu_skip; it++) {
        double t0 = MPI_Wtime();
        call(data, buf, n);
        double t1 = MPI_Wtime();
        if (it >= osu_skip) osu_timer += t1 - t0;
        MPI_Barrier(MPI_COMM_WORLD);
    }
    double osu_latency = osu_timer / osu_iters;
    MPI_Reduce(&osu_latency, &osu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    /* Back to back: the clocks of all calls first, their slowest ranks after. */
    double *b2b = calloc(iters, sizeof(double)), *b2b_slowest = calloc(iters, sizeof(double));
    MPI_Barrier(MPI_COMM_WORLD);
    double last = MPI_Wtime();
    for (int it = 0; it < iters; it++) {
        call(data, buf, n);
        double now = MPI_Wtime();
        b2b[it] = now - last;
        last = now;
    }
    MPI_Reduce(b2b, b2b_slowest, iters, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    /* Verification after every clock has stopped. */
    size_t b = n / size, lo = which == REDUCE_SCATTER ? (size_t)rank * b : 0;
    size_t hi = which == REDUCE_SCATTER ? lo + b : n;
    if (which == REDUCE && rank != 0) hi = 0;
    for (size_t i = lo; i < hi && ok; i++) {
        /* int32 sums wrap (summed as uint32); the floats' sums are small integers. */
        double want = 0;
        uint32_t wrapped = 0;
        if (which == ALL_GATHER)
            want = value(seed, (int)(i / b), i);
        else if (which == BROADCAST)
            want = value(seed, 0, i);
        else
            for (int m = 0; m < size; m++) {
                want += value(seed, m, i);
                wrapped += (uint32_t)element(seed, m, i);
            }
        if (dtype == INT32 && which != ALL_GATHER && which != BROADCAST) want = (int32_t)wrapped;
        ok = get(first, i - lo) == want;
    }
    int all_ok;
    MPI_Reduce(&ok, &all_ok, 1, MPI_INT, MPI_LAND, 0, MPI_COMM_WORLD);
    MPI_Reduce(&tx, &tx_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&rx, &rx_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("{\"ranks\":%d,\"bytes\":%zu,\"verified\":%s,\"tx_bytes_per_rank\":%.0f,\"rx_bytes_per_rank\":%.0f,\"osu_us\":%.3f,\"osu_iterations\":%d,\"seconds\":[",
               size, bytes, all_ok ? "true" : "false", tx_sum / size, rx_sum / size, osu_sum / size * 1e6, osu_iters);
        for (int it = 0; it < iters; it++) printf("%s%.9f", it ? "," : "", times[it]);
        printf("],\"back_to_back\":[");
        for (int it = 0; it < iters; it++) printf("%s%.9f", it ? "," : "", b2b_slowest[it]);
        printf("]");
        if (cpu) {
            /* The switch workers' report format (CpuWindow): counters in seconds. */
            double tick = (double)sysconf(_SC_CLK_TCK);
            printf(",\"cpu_windows\":[");
            for (int it = 0; it < iters; it++) {
                unsigned long long *w[2] = {starts[it], ends[it]};
                printf("%s{", it ? "," : "");
                for (int e = 0; e < 2; e++)
                    printf("%s\"%s\":{\"wall_ns\":%llu,\"user\":%.2f,\"system\":%.2f,\"softirq\":%.2f}", e ? "," : "",
                           e ? "end" : "start", w[e][WALL], w[e][USER] / tick, w[e][SYSTEM] / tick, w[e][SOFTIRQ] / tick);
                printf("}");
            }
            printf("]");
        }
        printf("}\n");
    }
    MPI_Finalize();
    return 0;
}
