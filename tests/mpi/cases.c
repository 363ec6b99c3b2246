/* The cases of the MPI library's table (docs/mpi.md), one per run, each an ordinary MPI
 * program; every result is checked against the value computed locally.
 * Usage: cases recv GO   rank 0: MPI_Iallreduce, MPI_Wait, MPI_Send to 1; rank 1:
 *                        MPI_Iallreduce, MPI_Recv from 0, MPI_Wait (it sits in the receive
 *                        while rank 0 waits); after a first allreduce, rank 0 waits for
 *                        the file GO (the test cuts its results off first)
 *        cases slow S    rank 0 starts its allreduce S seconds after the others
 *        cases nan       rank 1 puts a NaN into element 5 of a float sum
 *        cases mismatch  an MPI_Bcast from rank 0 of N int, of N - 1 on rank 1 (a program
 *                        error: the library aborts the job, naming the call)
 *        cases routed_apart   rank 1's MPI_Allreduce of 4096 int, the others' of 4095:
 *                        with XAGG_ROUTE=0-16KiB one goes to Open MPI and the others to
 *                        the switch (a program error: the library aborts the job)
 *        cases finalize_early the last rank goes to MPI_Finalize while the others make
 *                        another allreduce (the library aborts the job, naming it)
 *        cases pair      two MPI_Iallreduce in flight, completed by one MPI_Waitall
 *        cases sizes     int sums of 1 KiB, 64 KiB and 1 MiB; broadcasts of 1 KiB, 4 KiB and 1 MiB
 *        cases datatypes the ranks pass datatypes of one type signature each their own way
 *                        (contiguous, strided, plain MPI_INT, an indexed type holding
 *                        its elements in reverse) to broadcasts from ranks 0 and 1, an
 *                        allreduce (in place and not), an MPI_Iallreduce whose datatype
 *                        is freed before MPI_Wait, a reduce, an all-gather and a
 *                        reduce-scatter (4 ranks)
 *        cases collectives GO   after a first allreduce, rank 0 waits for the file GO (the
 *                        test cuts its results off first); then MPI_Reduce_scatter_block
 *                        (blocks of 200,000 int), MPI_Reduce to rank 0, MPI_Allgather and
 *                        MPI_Bcast from rank 1, each of size x 200,000 int
 *        cases icollectives   MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast (root
 *                        1), MPI_Ireduce (root 2) and MPI_Ireduce_scatter of unequal counts
 *                        in flight together (blocks of 50,000 int), completed by one
 *                        MPI_Waitall; then an MPI_Ibcast by MPI_Wait
 *        cases unwrapped rank 0: MPI_Iallreduce of 4 MiB, MPI_Wait, MPI_Send to 1; rank 1:
 *                        MPI_Iallreduce, MPI_Recv from 0, MPI_Wait: more segments than
 *                        slots, so rank 1's later rounds go out while it sits in MPI_Recv
 *        cases threads   MPI_THREAD_MULTIPLE: two threads, each with a communicator of its
 *                        own, 5 allreduces each; even ranks start on the first, odd ranks
 *                        on the second (MPI allows this order; only one collective at a
 *                        time on one communicator is required)
 *        cases status    MPI_Iallreduce, then MPI_Request_get_status until it says done
 *        cases packed    float and double sums of {1e10, 1e-10} on every rank: the tiny
 *                        residual beside the large energy must come back as Open MPI's does
 *        cases order D   f32 and f64 sums of 1 MiB, rank r starting r (D = 0) or
 *                        size - 1 - r (D = 1) times 50 ms late; rank 0 prints the results'
 *                        hashes (the same bits whatever the order, in the exact mode)
 *                        (20 s at most), then MPI_Wait
 * Rank 0 prints "checks=C failures=F"; the exit status is 1 if anything failed. */
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static int rank, size, checks, failures;

static void expect(const char *what, long got, long want) {
    checks++;
    if (got != want) {
        failures++;
        fprintf(stderr, "rank %d: %s: got %ld, want %ld\n", rank, what, got, want);
    }
}

/* FNV-1a of n bytes. */
static unsigned long long fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    unsigned long long h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static double now(void) {
    struct timeval t;
    gettimeofday(&t, NULL);
    return t.tv_sec + t.tv_usec / 1e6;
}

/* An int sum of n elements: rank r's element i is r + i. */
static void fill(int *x, int n, int k) {
    for (int i = 0; i < n; i++) x[i] = rank + i + k;
}
static long wrong(const int *x, int n, int k) {
    long bad = 0;
    for (int i = 0; i < n; i++) bad += x[i] != size * (i + k) + size * (size - 1) / 2;
    return bad;
}

/* One thread's communicator and what it checks. */
struct lane {
    MPI_Comm comm;
    int k, delay_us, bad;
};

static void *allreduces(void *arg) {
    struct lane *l = arg;
    enum { M = 1024 };
    int z[M];
    usleep(l->delay_us);
    for (int j = 0; j < 5; j++) {
        fill(z, M, l->k + j);
        MPI_Allreduce(MPI_IN_PLACE, z, M, MPI_INT, MPI_SUM, l->comm);
        l->bad += wrong(z, M, l->k + j) != 0;
    }
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "threads") == 0) {
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        if (provided != MPI_THREAD_MULTIPLE) {
            fprintf(stderr, "MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    } else {
        MPI_Init(&argc, &argv);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    enum { N = 1024 };
    int *x = malloc(N * sizeof(int)), *y = malloc(N * sizeof(int));
    /* A first allreduce: the communicator joins the switch. */
    fill(x, N, 0);
    MPI_Allreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    expect("first", wrong(x, N, 0), 0);
    if (strcmp(mode, "recv") == 0 && argc > 2) {
        MPI_Request r;
        fill(x, N, 1);
        if (rank == 0) {
            while (access(argv[2], F_OK) != 0) usleep(10000);
            double t0 = MPI_Wtime();
            MPI_Iallreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            /* How long the switch's silence stalled the call: the give-up time, not twice. */
            printf("rank 0 recovered in %.2f s\n", MPI_Wtime() - t0);
            fflush(stdout);
            int token = 42;
            MPI_Send(&token, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
        } else if (rank == 1) {
            int token = 0;
            MPI_Iallreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
            MPI_Recv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            expect("token", token, 42);
        } else {
            MPI_Iallreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
        expect("recv", wrong(x, N, 1), 0);
    } else if (strcmp(mode, "slow") == 0 && argc > 2) {
        if (rank == 0) sleep(atoi(argv[2]));
        fill(x, N, 2);
        double t = now();
        MPI_Allreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        expect("slow", wrong(x, N, 2), 0);
        if (rank == 1) printf("rank 1 waited %.1f s\n", now() - t);
    } else if (strcmp(mode, "nan") == 0) {
        float *f = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++) f[i] = rank + 0.5f * i;
        if (rank == 1) f[5] = NAN;
        MPI_Allreduce(MPI_IN_PLACE, f, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        long bad = 0;
        for (int i = 0; i < N; i++)
            bad += i == 5 ? !isnan(f[i]) : f[i] != size * 0.5f * i + size * (size - 1) / 2;
        expect("nan", bad, 0);
        free(f);
    } else if (strcmp(mode, "mismatch") == 0) {
        fill(x, N, 5);
        MPI_Bcast(x, rank == 1 ? N - 1 : N, MPI_INT, 0, MPI_COMM_WORLD);
        expect("mismatch", 1, 0);
    } else if (strcmp(mode, "routed_apart") == 0) {
        /* A program error the route by size splits (XAGG_ROUTE=0-16KiB): rank 1 reduces
         * 4096 int (16 KiB: Open MPI's), the others 4095 (the switch's); each side waits
         * for the other. The library aborts the job, naming the call. */
        int *z = malloc(4096 * sizeof(int));
        fill(z, 4096, 6);
        MPI_Allreduce(MPI_IN_PLACE, z, rank == 1 ? 4096 : 4095, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        expect("routed apart", 1, 0);
        free(z);
    } else if (strcmp(mode, "finalize_early") == 0) {
        /* The last rank leaves for MPI_Finalize (as a Python rank does on an uncaught
         * exception) while the others make one more allreduce: the library aborts the
         * job, naming the rank and why, instead of waiting for it. */
        if (rank != size - 1) {
            fill(x, N, 7);
            MPI_Allreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            expect("finalize early", 1, 0);
        }
    } else if (strcmp(mode, "pair") == 0) {
        MPI_Request r[2];
        fill(x, N, 3);
        fill(y, N, 4);
        MPI_Iallreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[0]);
        MPI_Iallreduce(MPI_IN_PLACE, y, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[1]);
        MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
        expect("pair k", wrong(x, N, 3), 0);
        expect("pair k+1", wrong(y, N, 4), 0);
    } else if (strcmp(mode, "unwrapped") == 0) {
        enum { M = 1 << 20 };
        int *z = malloc(M * sizeof(int));
        MPI_Request r;
        fill(z, M, 5);
        MPI_Iallreduce(MPI_IN_PLACE, z, M, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
        if (rank == 0) {
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            int token = 42;
            MPI_Send(&token, 1, MPI_INT, 1, 7, MPI_COMM_WORLD);
        } else if (rank == 1) {
            int token = 0;
            MPI_Recv(&token, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
            expect("token", token, 42);
        } else {
            MPI_Wait(&r, MPI_STATUS_IGNORE);
        }
        expect("unwrapped", wrong(z, M, 5), 0);
        free(z);
    } else if (strcmp(mode, "threads") == 0) {
        struct lane l[2];
        pthread_t t[2];
        for (int i = 0; i < 2; i++) {
            MPI_Comm_dup(MPI_COMM_WORLD, &l[i].comm);
            l[i].k = 10 * (i + 1);
            l[i].bad = 0;
            /* Each rank starts on a different communicator than its neighbour. */
            l[i].delay_us = (rank % 2 == i) ? 0 : 300000;
        }
        for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, allreduces, &l[i]);
        for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
        for (int i = 0; i < 2; i++) {
            expect("threads", l[i].bad, 0);
            MPI_Comm_free(&l[i].comm);
        }
    } else if (strcmp(mode, "status") == 0) {
        MPI_Request r;
        int flag = 0;
        fill(x, N, 6);
        MPI_Iallreduce(MPI_IN_PLACE, x, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r);
        double t = now();
        while (!flag && now() - t < 20) MPI_Request_get_status(r, &flag, MPI_STATUS_IGNORE);
        expect("status says done", flag, 1);
        MPI_Wait(&r, MPI_STATUS_IGNORE);
        expect("status", wrong(x, N, 6), 0);
    } else if (strcmp(mode, "packed") == 0) {
        float f[2] = {1e10f, 1e-10f};
        double d[2] = {1e10, 1e-10};
        MPI_Allreduce(MPI_IN_PLACE, f, 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Allreduce(MPI_IN_PLACE, d, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        /* Sums of `size` equal values: exact in either type. */
        expect("packed f32 residual", f[1] == size * 1e-10f && f[0] == size * 1e10f, 1);
        expect("packed f64 residual", d[1] == size * 1e-10 && d[0] == size * 1e10, 1);
    } else if (strcmp(mode, "order") == 0 && argc > 2) {
        enum { M = 1 << 18 };
        float *f = malloc(M * sizeof(float));
        double *d = malloc(M * sizeof(double));
        /* Each rank's values of its own scale: blocks of different exponents meet. */
        for (int i = 0; i < M; i++) {
            long h = (rank * 7919L + i * 104729L) % 2001 - 1000;
            d[i] = h / (1000.0 * (1 + 3 * rank)) * (1 + i % 7);
            f[i] = (float)d[i];
        }
        int late = atoi(argv[2]) ? size - 1 - rank : rank;
        usleep(late * 50000);
        MPI_Allreduce(MPI_IN_PLACE, f, M, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        usleep(late * 50000);
        MPI_Allreduce(MPI_IN_PLACE, d, M, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0)
            printf("hashes f32 %016llx f64 %016llx\n", fnv(f, M * sizeof(float)),
                   fnv(d, M * sizeof(double)));
        free(f);
        free(d);
    } else if (strcmp(mode, "collectives") == 0 && argc > 2) {
        enum { B = 200000 };
        long all = (long)size * B, bad = 0;
        int *send = malloc(all * sizeof(int)), *recv = malloc(all * sizeof(int));
        int base = size * (size - 1) / 2;
        if (rank == 0)
            while (access(argv[2], F_OK) != 0) usleep(10000);
        for (long i = 0; i < all; i++) send[i] = rank + (int)(i % 1000003);
        MPI_Reduce_scatter_block(send, recv, B, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        for (long j = 0; j < B; j++) bad += recv[j] != size * (int)((rank * B + j) % 1000003) + base;
        expect("reduce_scatter_block", bad, 0);
        bad = 0;
        MPI_Reduce(send, recv, all, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0)
            for (long i = 0; i < all; i++) bad += recv[i] != size * (int)(i % 1000003) + base;
        expect("reduce", bad, 0);
        for (long j = 0; j < B; j++) send[j] = rank + 7 * (int)j;
        MPI_Allgather(send, B, MPI_INT, recv, B, MPI_INT, MPI_COMM_WORLD);
        bad = 0;
        for (long i = 0; i < all; i++) bad += recv[i] != (int)(i / B) + 7 * (int)(i % B);
        expect("allgather", bad, 0);
        for (long i = 0; i < all; i++) recv[i] = rank == 1 ? 3 * (int)i : -1;
        MPI_Bcast(recv, all, MPI_INT, 1, MPI_COMM_WORLD);
        bad = 0;
        for (long i = 0; i < all; i++) bad += recv[i] != 3 * (int)i;
        expect("bcast", bad, 0);
        free(send);
        free(recv);
    } else if (strcmp(mode, "first_nonblocking") == 0) {
        /* Legal orders of nonblocking calls, each the first call on its communicator: even
         * ranks start A's allreduce first, odd ranks B's (MPI orders collectives per
         * communicator only); rank 0 starts C's and then receives what rank 1 sends before
         * starting its own (a message past Open MPI's eager size). Then a blocking call on
         * A and B, and the opposite orders again. */
        MPI_Comm A, B, C;
        MPI_Comm_dup(MPI_COMM_WORLD, &A);
        MPI_Comm_dup(MPI_COMM_WORLD, &B);
        MPI_Comm_dup(MPI_COMM_WORLD, &C);
        int want = size * (size - 1) / 2;
        for (int round = 0; round < 2; round++) {
            int a = rank, b = 10 * rank, ra = -1, rb = -1;
            MPI_Request q[2];
            if (rank % 2 == 0) {
                MPI_Iallreduce(&a, &ra, 1, MPI_INT, MPI_SUM, A, &q[0]);
                MPI_Iallreduce(&b, &rb, 1, MPI_INT, MPI_SUM, B, &q[1]);
            } else {
                MPI_Iallreduce(&b, &rb, 1, MPI_INT, MPI_SUM, B, &q[1]);
                MPI_Iallreduce(&a, &ra, 1, MPI_INT, MPI_SUM, A, &q[0]);
            }
            MPI_Waitall(2, q, MPI_STATUSES_IGNORE);
            expect(round ? "opposite orders, joined" : "opposite orders, first calls",
                   (ra != want) + (rb != 10 * want), 0);
            MPI_Allreduce(&a, &ra, 1, MPI_INT, MPI_SUM, A);
            MPI_Allreduce(&b, &rb, 1, MPI_INT, MPI_SUM, B);
        }
        enum { R = 1 << 20 };
        double *m = malloc(R * sizeof(double));
        for (int i = 0; i < R; i++) m[i] = i;
        int c = rank, rc = -1;
        MPI_Request q;
        if (rank == 0) {
            MPI_Iallreduce(&c, &rc, 1, MPI_INT, MPI_SUM, C, &q);
            MPI_Recv(m, R, MPI_DOUBLE, 1, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == 1) {
            MPI_Send(m, R, MPI_DOUBLE, 0, 5, MPI_COMM_WORLD);
            MPI_Iallreduce(&c, &rc, 1, MPI_INT, MPI_SUM, C, &q);
        } else {
            MPI_Iallreduce(&c, &rc, 1, MPI_INT, MPI_SUM, C, &q);
        }
        MPI_Wait(&q, MPI_STATUS_IGNORE);
        expect("a receive between the first call and its wait", rc != want, 0);
        free(m);
        /* A and B are left to MPI_Finalize, as programs often leave theirs (mpi4py's
         * Split): every rank must retire them in one order (in a map's, the ranks waited
         * for each other on two different ones at exit). */
        MPI_Comm_free(&C);
    } else if (strcmp(mode, "icollectives") == 0) {
        enum { B = 50000 };
        long all = (long)size * B, bad = 0;
        int *in = malloc(all * sizeof(int)), *rs = malloc(B * sizeof(int));
        int *ag = malloc(all * sizeof(int)), *bc = malloc(all * sizeof(int));
        int *red = malloc(all * sizeof(int)), *mine = malloc(B * sizeof(int));
        int base = size * (size - 1) / 2;
        MPI_Request r[5];
        int *counts = malloc(size * sizeof(int)), *part = malloc(B * sizeof(int)), at = 0;
        for (int q = 0; q < size; q++) counts[q] = B / 2 + 7 * q;
        for (int q = 0; q < rank; q++) at += counts[q];
        for (long i = 0; i < all; i++) {
            in[i] = rank + (int)i;
            bc[i] = rank == 1 ? 5 * (int)i : -1;
        }
        for (long j = 0; j < B; j++) mine[j] = 11 * rank + (int)j;
        MPI_Ireduce_scatter_block(in, rs, B, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[0]);
        MPI_Iallgather(mine, B, MPI_INT, ag, B, MPI_INT, MPI_COMM_WORLD, &r[1]);
        MPI_Ibcast(bc, all, MPI_INT, 1, MPI_COMM_WORLD, &r[2]);
        MPI_Ireduce(in, red, all, MPI_INT, MPI_SUM, 2, MPI_COMM_WORLD, &r[3]);
        MPI_Ireduce_scatter(in, part, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &r[4]);
        MPI_Waitall(5, r, MPI_STATUSES_IGNORE);
        for (int j = 0; j < counts[rank]; j++) bad += part[j] != size * (at + j) + base;
        expect("ireduce_scatter, unequal counts", bad, 0);
        bad = 0;
        for (long j = 0; j < B; j++) bad += rs[j] != size * (int)(rank * B + j) + base;
        expect("ireduce_scatter_block", bad, 0);
        bad = 0;
        for (long i = 0; i < all; i++) bad += ag[i] != 11 * (int)(i / B) + (int)(i % B);
        expect("iallgather", bad, 0);
        bad = 0;
        for (long i = 0; i < all; i++) bad += bc[i] != 5 * (int)i;
        expect("ibcast", bad, 0);
        bad = 0;
        if (rank == 2)
            for (long i = 0; i < all; i++) bad += red[i] != size * (int)i + base;
        expect("ireduce", bad, 0);
        for (long i = 0; i < all; i++) bc[i] = rank == 0 ? 9 - (int)i : 0;
        MPI_Ibcast(bc, all, MPI_INT, 0, MPI_COMM_WORLD, &r[0]);
        MPI_Wait(&r[0], MPI_STATUS_IGNORE);
        bad = 0;
        for (long i = 0; i < all; i++) bad += bc[i] != 9 - (int)i;
        expect("ibcast by MPI_Wait", bad, 0);
        free(in);
        free(rs);
        free(ag);
        free(bc);
        free(red);
        free(mine);
        free(counts);
        free(part);
    } else if (strcmp(mode, "datatypes") == 0) {
        /* The ranks pass datatypes of one signature, each its own way: 4 x MPI_INT as one
         * contiguous type, a strided vector (every other int of a twice-as-long array), or
         * plain MPI_INT. */
        enum { N = 96 };
        MPI_Datatype c4, strided;
        MPI_Type_contiguous(4, MPI_INT, &c4);
        MPI_Type_commit(&c4);
        MPI_Type_vector(N, 1, 2, MPI_INT, &strided);
        MPI_Type_commit(&strided);
        int plain[N], wide[2 * N], bad;
        /* Broadcast from 0 as N/4 x c4, received as N ints (rank 2: into a strided
         * buffer); from 1 out of a strided buffer. */
        for (int root = 0; root < 2; root++) {
            for (int i = 0; i < N; i++) plain[i] = rank == root ? 3 * i + root : -1;
            for (int i = 0; i < 2 * N; i++) wide[i] = rank == root && i % 2 == 0 ? 3 * (i / 2) + root : -1;
            if (rank == root && root == 0)
                MPI_Bcast(plain, N / 4, c4, root, MPI_COMM_WORLD);
            else if (rank == root || rank == 2)
                MPI_Bcast(wide, 1, strided, root, MPI_COMM_WORLD);
            else
                MPI_Bcast(plain, N, MPI_INT, root, MPI_COMM_WORLD);
            bad = 0;
            for (int i = 0; i < N; i++) {
                int got = (rank == 2 || (rank == 1 && root == 1)) ? wide[2 * i] : plain[i];
                bad += got != 3 * i + root;
                /* The gaps of a strided buffer untouched. */
                bad += rank == 2 && wide[2 * i + 1] != -1;
            }
            expect("bcast of mixed datatypes", bad, 0);
        }
        /* Broadcast from 0 of 4 ints, which rank 1 receives in reverse order through an
         * indexed type: its elements back to back, but not in their order. */
        MPI_Datatype reversed;
        int ones[4] = {1, 1, 1, 1}, backwards[4] = {3, 2, 1, 0};
        MPI_Type_indexed(4, ones, backwards, MPI_INT, &reversed);
        MPI_Type_commit(&reversed);
        int four_in[4] = {10, 11, 12, 13};
        if (rank != 0) for (int i = 0; i < 4; i++) four_in[i] = -1;
        if (rank == 1)
            MPI_Bcast(four_in, 1, reversed, 0, MPI_COMM_WORLD);
        else
            MPI_Bcast(four_in, 4, MPI_INT, 0, MPI_COMM_WORLD);
        bad = 0;
        for (int i = 0; i < 4; i++) bad += four_in[i] != (rank == 1 ? 13 - i : 10 + i);
        expect("bcast into a reversed indexed type", bad, 0);
        MPI_Type_free(&reversed);
        /* Allreduce: rank 0 strided in and out, rank 1 strided in place, the others plain. */
        int out[2 * N];
        for (int i = 0; i < 2 * N; i++) wide[i] = i % 2 == 0 ? rank + i / 2 : -7, out[i] = -7;
        for (int i = 0; i < N; i++) plain[i] = rank + i;
        if (rank == 0)
            MPI_Allreduce(wide, out, 1, strided, MPI_SUM, MPI_COMM_WORLD);
        else if (rank == 1)
            MPI_Allreduce(MPI_IN_PLACE, wide, 1, strided, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Allreduce(MPI_IN_PLACE, plain, N / 4, c4, MPI_SUM, MPI_COMM_WORLD);
        bad = 0;
        for (int i = 0; i < N; i++) {
            int want = size * i + size * (size - 1) / 2;
            int got = rank == 0 ? out[2 * i] : rank == 1 ? wide[2 * i] : plain[i];
            bad += got != want;
            bad += rank == 0 && out[2 * i + 1] != -7;
            bad += rank == 1 && wide[2 * i + 1] != -7;
        }
        expect("allreduce of mixed datatypes", bad, 0);
        /* Nonblocking: rank 3 strided, unpacked when MPI_Wait hands it back, its datatype
         * freed before that (MPI allows it). */
        for (int i = 0; i < 2 * N; i++) wide[i] = i % 2 == 0 ? rank + i / 2 : -7;
        for (int i = 0; i < N; i++) plain[i] = rank + i;
        MPI_Request req;
        if (rank == 3) {
            MPI_Datatype soon_freed;
            MPI_Type_dup(strided, &soon_freed);
            MPI_Iallreduce(MPI_IN_PLACE, wide, 1, soon_freed, MPI_SUM, MPI_COMM_WORLD, &req);
            MPI_Type_free(&soon_freed);
        } else
            MPI_Iallreduce(MPI_IN_PLACE, plain, N, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        bad = 0;
        for (int i = 0; i < N; i++)
            bad += (rank == 3 ? wide[2 * i] : plain[i]) != size * i + size * (size - 1) / 2;
        expect("iallreduce of mixed datatypes", bad, 0);
        /* Reduce to rank 2, which takes it strided; rank 0 gives c4s. */
        for (int i = 0; i < N; i++) plain[i] = rank + i;
        for (int i = 0; i < 2 * N; i++) wide[i] = -7, out[i] = i % 2 == 0 ? rank + i / 2 : -7;
        if (rank == 2)
            MPI_Reduce(out, wide, 1, strided, MPI_SUM, 2, MPI_COMM_WORLD);
        else if (rank == 0)
            MPI_Reduce(plain, NULL, N / 4, c4, MPI_SUM, 2, MPI_COMM_WORLD);
        else
            MPI_Reduce(plain, NULL, N, MPI_INT, MPI_SUM, 2, MPI_COMM_WORLD);
        bad = 0;
        if (rank == 2)
            for (int i = 0; i < N; i++)
                bad += (wide[2 * i] != size * i + size * (size - 1) / 2) + (wide[2 * i + 1] != -7);
        expect("reduce of mixed datatypes", bad, 0);
        /* All-gather of 4 ints a rank: rank 0 sends a c4 and receives c4s; rank 1 sends
         * every other int of its wide buffer. */
        int mine[8], gathered[4 * 64];
        for (int i = 0; i < 8; i++) mine[i] = i % 2 == 0 ? 10 * rank + i / 2 : -7;
        int four[4] = {10 * rank, 10 * rank + 1, 10 * rank + 2, 10 * rank + 3};
        MPI_Datatype every_other;
        MPI_Type_vector(4, 1, 2, MPI_INT, &every_other);
        MPI_Type_commit(&every_other);
        if (rank == 0)
            MPI_Allgather(four, 1, c4, gathered, 1, c4, MPI_COMM_WORLD);
        else if (rank == 1)
            MPI_Allgather(mine, 1, every_other, gathered, 4, MPI_INT, MPI_COMM_WORLD);
        else
            MPI_Allgather(four, 4, MPI_INT, gathered, 4, MPI_INT, MPI_COMM_WORLD);
        bad = 0;
        for (int r = 0; r < size; r++)
            for (int i = 0; i < 4; i++) bad += gathered[4 * r + i] != 10 * r + i;
        expect("allgather of mixed datatypes", bad, 0);
        /* Reduce-scatter of blocks of 4 ints: rank 0 names its block one c4. */
        int *rsin = malloc(4 * size * sizeof(int)), rsout[4];
        for (int i = 0; i < 4 * size; i++) rsin[i] = rank + i;
        if (rank == 0)
            MPI_Reduce_scatter_block(rsin, rsout, 1, c4, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Reduce_scatter_block(rsin, rsout, 4, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        bad = 0;
        for (int i = 0; i < 4; i++) bad += rsout[i] != size * (4 * rank + i) + size * (size - 1) / 2;
        expect("reduce_scatter_block of mixed datatypes", bad, 0);
        free(rsin);
        MPI_Type_free(&every_other);
        MPI_Type_free(&strided);
        MPI_Type_free(&c4);
    } else if (strcmp(mode, "sizes") == 0) {
        int lens[] = {256, 16384, 262144};
        for (int k = 0; k < 3; k++) {
            int *z = malloc(lens[k] * sizeof(int));
            fill(z, lens[k], k);
            MPI_Allreduce(MPI_IN_PLACE, z, lens[k], MPI_INT, MPI_SUM, MPI_COMM_WORLD);
            expect("sizes", wrong(z, lens[k], k), 0);
            free(z);
        }
        /* Broadcasts take their own route by size. */
        int blens[] = {256, 1024, 262144};
        for (int k = 0; k < 3; k++) {
            int *z = malloc(blens[k] * sizeof(int));
            for (int i = 0; i < blens[k]; i++) z[i] = rank == 0 ? 7 * i + k : -1;
            MPI_Bcast(z, blens[k], MPI_INT, 0, MPI_COMM_WORLD);
            long bad = 0;
            for (int i = 0; i < blens[k]; i++) bad += z[i] != 7 * i + k;
            expect("sizes (broadcast)", bad, 0);
            free(z);
        }
    } else {
        expect("a known case", 0, 1);
    }
    int all_failures = 0;
    PMPI_Reduce(&failures, &all_failures, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("checks=%d failures=%d\n", checks, all_failures);
    free(x);
    free(y);
    MPI_Finalize();
    return all_failures != 0;
}
