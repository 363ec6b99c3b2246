/* An ordinary MPI program using the collectives besides allreduce: MPI_Reduce_scatter_block,
 * MPI_Reduce_scatter (equal counts, and unequal ones, in place too), MPI_Allgather, MPI_Bcast and
 * MPI_Reduce, over int, unsigned, long, float and double, in place and not, every root,
 * from one element a block to more than a window of segments; each result checked
 * against values computed here. Prints `checks=N failures=M` on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size, checks, failures;

static void expect(const char *what, int ok, long n) {
    checks++;
    if (!ok) {
        failures++;
        printf("rank %d: %s of %ld elements wrong\n", rank, what, n);
    }
}

/* Rank r's element i: small integers, so sums of floats and doubles are exact. */
static int value(int r, long i) { return (int)((r * 7 + i * 13) % 17) - 8; }

#define CHECKS(T, MPI_T)                                                                   \
    static void check_##T(long block) {                                                    \
        long n = block * size;                                                             \
        T *in = malloc(n * sizeof(T)), *out = malloc(n * sizeof(T));                       \
        T *want = malloc(n * sizeof(T));                                                   \
        for (long i = 0; i < n; i++) {                                                     \
            in[i] = (T)value(rank, i);                                                     \
            want[i] = 0;                                                                   \
            for (int r = 0; r < size; r++) want[i] += (T)value(r, i);                      \
        }                                                                                  \
        int ok;                                                                            \
        /* Reduce-scatter: this rank's block of the sum. */                                \
        MPI_Reduce_scatter_block(in, out, block, MPI_T, MPI_SUM, MPI_COMM_WORLD);          \
        ok = memcmp(out, want + rank * block, block * sizeof(T)) == 0;                     \
        expect("reduce_scatter_block " #T, ok, n);                                         \
        memcpy(out, in, n * sizeof(T));                                                    \
        MPI_Reduce_scatter_block(MPI_IN_PLACE, out, block, MPI_T, MPI_SUM, MPI_COMM_WORLD); \
        ok = memcmp(out, want + rank * block, block * sizeof(T)) == 0;                     \
        expect("reduce_scatter_block in place " #T, ok, n);                                \
        int *counts = malloc(size * sizeof(int));                                          \
        for (int r = 0; r < size; r++) counts[r] = (int)block;                             \
        MPI_Reduce_scatter(in, out, counts, MPI_T, MPI_SUM, MPI_COMM_WORLD);               \
        ok = memcmp(out, want + rank * block, block * sizeof(T)) == 0;                     \
        expect("reduce_scatter " #T, ok, n);                                               \
        free(counts);                                                                      \
        /* All-gather: every rank's block of its own input. */                             \
        memset(out, 0, n * sizeof(T));                                                     \
        MPI_Allgather(in + rank * block, block, MPI_T, out, block, MPI_T, MPI_COMM_WORLD); \
        ok = 1;                                                                            \
        for (long i = 0; i < n; i++) ok &= out[i] == (T)value(i / block, i);               \
        expect("allgather " #T, ok, n);                                                    \
        memset(out, 0, n * sizeof(T));                                                     \
        memcpy(out + rank * block, in + rank * block, block * sizeof(T));                  \
        MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, out, block, MPI_T, MPI_COMM_WORLD); \
        ok = 1;                                                                            \
        for (long i = 0; i < n; i++) ok &= out[i] == (T)value(i / block, i);               \
        expect("allgather in place " #T, ok, n);                                           \
        /* Broadcast and reduce from every root. */                                        \
        for (int root = 0; root < size; root++) {                                          \
            if (rank == root) memcpy(out, in, n * sizeof(T)); else memset(out, 0, n * sizeof(T)); \
            MPI_Bcast(out, (int)n, MPI_T, root, MPI_COMM_WORLD);                           \
            ok = 1;                                                                        \
            for (long i = 0; i < n; i++) ok &= out[i] == (T)value(root, i);                \
            expect("bcast " #T, ok, n);                                                    \
            memset(out, 0, n * sizeof(T));                                                 \
            MPI_Reduce(in, out, (int)n, MPI_T, MPI_SUM, root, MPI_COMM_WORLD);             \
            if (rank == root) expect("reduce " #T, memcmp(out, want, n * sizeof(T)) == 0, n); \
            else {                                                                         \
                ok = 1;                                                                    \
                for (long i = 0; i < n; i++) ok &= out[i] == 0;                            \
                expect("reduce leaves a non-root's buffer " #T, ok, n);                    \
            }                                                                              \
            if (rank == root) {                                                            \
                memcpy(out, in, n * sizeof(T));                                            \
                MPI_Reduce(MPI_IN_PLACE, out, (int)n, MPI_T, MPI_SUM, root, MPI_COMM_WORLD); \
                expect("reduce in place " #T, memcmp(out, want, n * sizeof(T)) == 0, n);   \
            } else {                                                                       \
                MPI_Reduce(in, NULL, (int)n, MPI_T, MPI_SUM, root, MPI_COMM_WORLD);        \
            }                                                                              \
        }                                                                                  \
        free(in);                                                                          \
        free(out);                                                                         \
        free(want);                                                                        \
    }

CHECKS(int, MPI_INT)
CHECKS(unsigned, MPI_UNSIGNED)
CHECKS(long, MPI_LONG)
CHECKS(float, MPI_FLOAT)
CHECKS(double, MPI_DOUBLE)

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    long blocks[] = {1, 861, 40000};
    for (int b = 0; b < 3; b++) {
        check_int(blocks[b]);
        check_unsigned(blocks[b]);
        check_long(blocks[b]);
        check_float(blocks[b]);
        check_double(blocks[b]);
    }
    /* Unequal counts (blocks of the largest, each rank's part padded), and in place. */
    int *counts = malloc(size * sizeof(int)), total = 0;
    for (int r = 0; r < size; r++) total += counts[r] = r + 1;
    int *in = malloc(total * sizeof(int)), out[64];
    for (int i = 0; i < total; i++) in[i] = value(rank, i);
    MPI_Reduce_scatter(in, out, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int at = 0, ok = 1;
    for (int r = 0; r < rank; r++) at += counts[r];
    for (int i = 0; i < counts[rank]; i++) {
        int w = 0;
        for (int r = 0; r < size; r++) w += value(r, at + i);
        ok &= out[i] == w;
    }
    expect("reduce_scatter with unequal counts", ok, total);
    int *inplace = malloc(total * sizeof(int));
    memcpy(inplace, in, total * sizeof(int));
    MPI_Reduce_scatter(MPI_IN_PLACE, inplace, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    ok = 1;
    for (int i = 0; i < counts[rank]; i++) ok &= inplace[i] == out[i];
    expect("reduce_scatter with unequal counts in place", ok, total);
    free(inplace);
    free(in);
    free(counts);
    int all_failures = 0;
    PMPI_Reduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("checks=%d failures=%d\n", checks, all_failures);
    MPI_Finalize();
    return all_failures != 0;
}
