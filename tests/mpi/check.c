/* An ordinary MPI program, unaware of any switch: allreduces of every predefined type and
 * op a program commonly uses, in place and not, on MPI_COMM_WORLD and on communicators
 * split and duplicated from it; a user-defined op; MPI_Iallreduce among point-to-point
 * requests completed by MPI_Waitall, MPI_Test, MPI_Waitany, MPI_Testall, MPI_Wait,
 * MPI_Waitsome, MPI_Testany and MPI_Testsome; a barrier. Every result is checked against the value computed locally.
 * Usage: check            the whole set, once
 *        check loop N     N double sums of 4096 elements, 20 ms apart (a run to disturb)
 * Rank 0 prints "checks=C failures=F"; the exit status is 1 if anything failed. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size, checks, failures;

/* Member r's element i: small integers (exact in every type), some negative. */
static long value(int r, long i) { return ((r * 7 + i * 13) % 17) - 8; }

enum { SUM, MIN, MAX, PROD, BAND, BOR, BXOR };
static MPI_Op mpi_op(int op) {
    MPI_Op ops[] = {MPI_SUM, MPI_MIN, MPI_MAX, MPI_PROD, MPI_BAND, MPI_BOR, MPI_BXOR};
    return ops[op];
}

#define CHECK_TYPE(T, NAME, MPITYPE, INTEGER)                                              \
    static void check_##NAME(int op, long n, int in_place, MPI_Comm comm) {                \
        int r, size_c, rank_c;                                                             \
        MPI_Comm_size(comm, &size_c);                                                      \
        MPI_Comm_rank(comm, &rank_c);                                                      \
        T *in = malloc(n * sizeof(T)), *out = malloc(n * sizeof(T));                        \
        for (long i = 0; i < n; i++) {                                                     \
            in[i] = (T)(op == PROD ? (value(rank_c, i) % 3 + 2) : value(rank_c, i));       \
            out[i] = (T)-99;                                                               \
        }                                                                                  \
        if (in_place) {                                                                    \
            memcpy(out, in, n * sizeof(T));                                                \
            MPI_Allreduce(MPI_IN_PLACE, out, (int)n, MPITYPE, mpi_op(op), comm);           \
        } else {                                                                           \
            MPI_Allreduce(in, out, (int)n, MPITYPE, mpi_op(op), comm);                     \
        }                                                                                  \
        long bad = 0;                                                                      \
        for (long i = 0; i < n; i++) {                                                     \
            T want = 0;                                                                    \
            for (r = 0; r < size_c; r++) {                                                 \
                T v = (T)(op == PROD ? (value(r, i) % 3 + 2) : value(r, i));               \
                if (r == 0) { want = v; continue; }                                        \
                switch (op) {                                                              \
                case SUM: want = want + v; break;                                          \
                case MIN: want = v < want ? v : want; break;                               \
                case MAX: want = v > want ? v : want; break;                               \
                case PROD: want = want * v; break;                                         \
                default: want = INTEGER##_BITS(want, v, op);                               \
                }                                                                          \
            }                                                                              \
            if (out[i] != want) bad++;                                                     \
        }                                                                                  \
        if (!in_place)                                                                     \
            for (long i = 0; i < n; i++)                                                   \
                if (in[i] != (T)(op == PROD ? (value(rank_c, i) % 3 + 2) : value(rank_c, i))) bad++; \
        checks++;                                                                          \
        if (bad) {                                                                         \
            failures++;                                                                    \
            fprintf(stderr, "rank %d: %s op %d n %ld in_place %d: %ld wrong\n", rank, #NAME, op, n, in_place, bad); \
        }                                                                                  \
        free(in);                                                                          \
        free(out);                                                                         \
    }

#define INT_BITS(a, b, op) ((op) == BAND ? ((a) & (b)) : (op) == BOR ? ((a) | (b)) : ((a) ^ (b)))
#define FLOAT_BITS(a, b, op) (a)

CHECK_TYPE(int, int, MPI_INT, INT)
CHECK_TYPE(int32_t, int32, MPI_INT32_T, INT)
CHECK_TYPE(unsigned, unsigned, MPI_UNSIGNED, INT)
CHECK_TYPE(long, long, MPI_LONG, INT)
CHECK_TYPE(int64_t, int64, MPI_INT64_T, INT)
CHECK_TYPE(float, float, MPI_FLOAT, FLOAT)
CHECK_TYPE(double, double, MPI_DOUBLE, FLOAT)

static void check_all(MPI_Comm comm) {
    long sizes[] = {1, 1000, 100003};
    for (int s = 0; s < 3; s++)
        for (int in_place = 0; in_place < 2; in_place++)
            for (int op = SUM; op <= BXOR; op++) {
                check_int(op, sizes[s], in_place, comm);
                check_int32(op, sizes[s], in_place, comm);
                check_unsigned(op, sizes[s], in_place, comm);
                check_long(op, sizes[s], in_place, comm);
                check_int64(op, sizes[s], in_place, comm);
                if (op <= MAX) {
                    check_float(op, sizes[s], in_place, comm);
                    check_double(op, sizes[s], in_place, comm);
                }
            }
}

static void user_sum(void *in, void *inout, int *len, MPI_Datatype *t) {
    (void)t;
    for (int i = 0; i < *len; i++) ((int *)inout)[i] += ((int *)in)[i];
}

static void expect(const char *what, long got, long want) {
    checks++;
    if (got != want) {
        failures++;
        fprintf(stderr, "rank %d: %s: %ld, want %ld\n", rank, what, got, want);
    }
}

/* Iallreduce among point-to-point requests, completed in several ways. */
static void check_requests(void) {
    enum { N = 50000 };
    int *a = malloc(N * sizeof(int)), *b = malloc(N * sizeof(int));
    double *c = malloc(N * sizeof(double));
    int token_out = rank, token_in = -1;
    for (int i = 0; i < N; i++) { a[i] = rank + i; c[i] = 0.25 * rank; }
    MPI_Request reqs[4];
    MPI_Iallreduce(a, b, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
    MPI_Irecv(&token_in, 1, MPI_INT, (rank + size - 1) % size, 7, MPI_COMM_WORLD, &reqs[1]);
    MPI_Isend(&token_out, 1, MPI_INT, (rank + 1) % size, 7, MPI_COMM_WORLD, &reqs[2]);
    MPI_Iallreduce(MPI_IN_PLACE, c, N, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &reqs[3]);
    MPI_Waitall(4, reqs, MPI_STATUSES_IGNORE);
    long sum = (long)size * (size - 1) / 2;
    long bad = 0;
    for (int i = 0; i < N; i++) bad += b[i] != sum + (long)size * i;
    expect("Iallreduce by Waitall", bad, 0);
    expect("Isend/Irecv beside it", token_in, (rank + size - 1) % size);
    bad = 0;
    for (int i = 0; i < N; i++) bad += c[i] != 0.25 * (size - 1);
    expect("in-place Iallreduce by Waitall", bad, 0);

    /* MPI_Test until done. */
    MPI_Request r;
    int flag = 0;
    for (int i = 0; i < N; i++) a[i] = 1;
    MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
    while (!flag) MPI_Test(&r, &flag, MPI_STATUS_IGNORE);
    bad = 0;
    for (int i = 0; i < N; i++) bad += a[i] != size;
    expect("Iallreduce by Test", bad, 0);

    /* MPI_Waitany over one of ours and a receive. */
    MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
    MPI_Irecv(&token_in, 1, MPI_INT, (rank + size - 1) % size, 8, MPI_COMM_WORLD, &reqs[1]);
    MPI_Send(&token_out, 1, MPI_INT, (rank + 1) % size, 8, MPI_COMM_WORLD);
    for (int k = 0; k < 2; k++) {
        int index;
        MPI_Waitany(2, reqs, &index, MPI_STATUS_IGNORE);
    }
    bad = 0;
    for (int i = 0; i < N; i++) bad += a[i] != size * size;
    expect("Iallreduce by Waitany", bad, 0);

    /* MPI_Testall over two of ours (MPI_Request_free is erroneous for a nonblocking
     * collective's request: MPI 3.1, 5.12). */
    for (int i = 0; i < N; i++) c[i] = 1.5;
    MPI_Iallreduce(MPI_IN_PLACE, c, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
    MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &reqs[1]);
    flag = 0;
    while (!flag) MPI_Testall(2, reqs, &flag, MPI_STATUSES_IGNORE);
    bad = 0;
    for (int i = 0; i < N; i++) bad += c[i] != 1.5 * size || a[i] != size * size;
    expect("two Iallreduces by Testall", bad, 0);

    /* MPI_Wait on one. */
    for (int i = 0; i < N; i++) a[i] = rank;
    MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    bad = 0;
    for (int i = 0; i < N; i++) bad += a[i] != size - 1;
    expect("Iallreduce by Wait", bad, 0);

    /* MPI_Waitsome, MPI_Testany and MPI_Testsome until each of two is done. */
    for (int way = 0; way < 3; way++) {
        for (int i = 0; i < N; i++) { a[i] = 1; c[i] = 0.5; }
        MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &reqs[0]);
        MPI_Iallreduce(MPI_IN_PLACE, c, N, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &reqs[1]);
        int done = 0;
        while (done < 2) {
            int count = 0, indices[2], index;
            if (way == 0) {
                MPI_Waitsome(2, reqs, &count, indices, MPI_STATUSES_IGNORE);
            } else if (way == 1) {
                MPI_Testany(2, reqs, &index, &flag, MPI_STATUS_IGNORE);
                count = flag && index != MPI_UNDEFINED;
            } else {
                MPI_Testsome(2, reqs, &count, indices, MPI_STATUSES_IGNORE);
            }
            done += count;
        }
        bad = 0;
        for (int i = 0; i < N; i++) bad += a[i] != size || c[i] != 0.5 * size;
        expect(way == 0 ? "Iallreduces by Waitsome" : way == 1 ? "Iallreduces by Testany" : "Iallreduces by Testsome", bad, 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    free(a);
    free(b);
    free(c);
}

int main(int argc, char **argv) {
    int provided;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (argc > 2 && strcmp(argv[1], "loop") == 0) {
        int n = atoi(argv[2]);
        double *x = malloc(4096 * sizeof(double));
        for (int k = 0; k < n; k++) {
            for (int i = 0; i < 4096; i++) x[i] = 0.5 * (rank + i + k);
            MPI_Allreduce(MPI_IN_PLACE, x, 4096, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            long bad = 0;
            for (int i = 0; i < 4096; i++)
                bad += x[i] != 0.5 * ((double)size * (i + k) + (double)size * (size - 1) / 2);
            expect("loop", bad, 0);
            usleep(20000);
        }
        free(x);
    } else {
        check_all(MPI_COMM_WORLD);
        /* A user-defined op: Open MPI's. */
        int one = 1, total = 0;
        MPI_Op op;
        MPI_Op_create(user_sum, 1, &op);
        MPI_Allreduce(&one, &total, 1, MPI_INT, op, MPI_COMM_WORLD);
        MPI_Op_free(&op);
        expect("user-defined op", total, size);
        /* A type and an op over a type the switch does not take: Open MPI's, named. */
        short s1 = 1, stotal = 0;
        MPI_Allreduce(&s1, &stotal, 1, MPI_SHORT, MPI_SUM, MPI_COMM_WORLD);
        expect("MPI_SHORT sum", stotal, size);
        float two = 2.0f, fprod = 0.0f;
        MPI_Allreduce(&two, &fprod, 1, MPI_FLOAT, MPI_PROD, MPI_COMM_WORLD);
        expect("MPI_FLOAT product", fprod == (float)(1 << size), 1);
        check_requests();
        /* Derived communicators. */
        MPI_Comm half, dup;
        MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &half);
        MPI_Comm_dup(MPI_COMM_WORLD, &dup);
        int hsize;
        MPI_Comm_size(half, &hsize);
        long mine = rank, got = 0;
        MPI_Allreduce(&mine, &got, 1, MPI_LONG, MPI_SUM, half);
        long want = 0;
        for (int r = rank % 2; r < size; r += 2) want += r;
        expect("split", got, want);
        check_double(SUM, 30000, 1, dup);
        check_int(BXOR, 30000, 0, dup);
        MPI_Comm_free(&half);
        MPI_Comm_free(&dup);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    int all_failures = 0;
    MPI_Reduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("checks=%d failures=%d\n", checks, all_failures);
    MPI_Finalize();
    return all_failures != 0;
}
