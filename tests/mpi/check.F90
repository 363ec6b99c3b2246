! An ordinary Fortran MPI program: sums, minima and maxima of INTEGER, REAL and DOUBLE
! PRECISION arrays, in place and not, then reduce-scatters (of blocks and of unequal
! counts), an all-gather, a broadcast
! and a reduce, checked against local values. It takes MPI's
! bindings from the `mpi` module, or with -DMPIF_H from `mpif.h` (the tests build both).
program check_fortran
#ifdef MPIF_H
  implicit none
  include 'mpif.h'
#else
  use mpi
  implicit none
#endif
  integer, parameter :: n = 20000
  integer :: ierr, rank, nranks, i, r, failures, all_failures, checks, at, counts(4)
  integer :: ia(n), ib(n), iwant(n), ixor(n), iblock(n / 4)
  real :: ra(n), rb(n)
  double precision :: da(n), db(n), dwant(n)

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, nranks, ierr)
  failures = 0
  checks = 0

  do i = 1, n
    ia(i) = mod(rank * 7 + i * 13, 17) - 8
    ra(i) = 0.25 * ia(i)
    da(i) = 0.125d0 * ia(i)
  end do
  iwant = 0
  ixor = 0
  do r = 0, nranks - 1
    do i = 1, n
      iwant(i) = iwant(i) + mod(r * 7 + i * 13, 17) - 8
      ixor(i) = ieor(ixor(i), mod(r * 7 + i * 13, 17) - 8)
    end do
  end do
  dwant = 0.125d0 * iwant

  call MPI_Allreduce(ia, ib, n, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(all(ib == iwant))
  call MPI_Allreduce(ra, rb, n, MPI_REAL, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(all(rb == real(0.25d0 * iwant)))
  call MPI_Allreduce(da, db, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(all(db == dwant))
  db = da
  call MPI_Allreduce(MPI_IN_PLACE, db, n, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(all(db == dwant))
  ib = ia
  call MPI_Allreduce(MPI_IN_PLACE, ib, n, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
  call tally(all(ib >= ia) .and. maxval(ib) == 8)
  call MPI_Allreduce(ra, rb, n, MPI_REAL, MPI_MIN, MPI_COMM_WORLD, ierr)
  call tally(all(rb <= ra) .and. minval(rb) == -2.0)
  call MPI_Allreduce(ia, ib, n, MPI_INTEGER, MPI_BXOR, MPI_COMM_WORLD, ierr)
  call tally(all(ib == ixor))
  call MPI_Allreduce(1, i, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(i == nranks)
  call MPI_Barrier(MPI_COMM_WORLD, ierr)

  ! The other collectives (n / nranks elements a block: n is a multiple of 4 ranks).
  call MPI_Reduce_scatter_block(ia, iblock, n / nranks, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  call tally(all(iblock(1:n / nranks) == iwant(rank * (n / nranks) + 1:(rank + 1) * (n / nranks))))
  ! Unequal counts: n / nranks - 10, - 5, + 0, + 5 (4 ranks).
  counts = [(n / nranks - 10 + 5 * r, r = 0, 3)]
  iblock = 0
  call MPI_Reduce_scatter(ia, iblock, counts, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  at = sum(counts(1:rank))
  call tally(all(iblock(1:counts(rank + 1)) == iwant(at + 1:at + counts(rank + 1))))
  iblock(1:n / nranks) = ia(rank * (n / nranks) + 1:(rank + 1) * (n / nranks))
  ib = 0
  call MPI_Allgather(iblock, n / nranks, MPI_INTEGER, ib, n / nranks, MPI_INTEGER, MPI_COMM_WORLD, ierr)
  do r = 0, nranks - 1
    call tally(all(ib(r * (n / nranks) + 1:(r + 1) * (n / nranks)) == &
      [(mod(r * 7 + i * 13, 17) - 8, i = r * (n / nranks) + 1, (r + 1) * (n / nranks))]))
  end do
  db = da
  call MPI_Bcast(db, n, MPI_DOUBLE_PRECISION, 1, MPI_COMM_WORLD, ierr)
  call tally(all(db == [(0.125d0 * (mod(7 + i * 13, 17) - 8), i = 1, n)]))
  db = 0
  call MPI_Reduce(da, db, n, MPI_DOUBLE_PRECISION, MPI_SUM, 2, MPI_COMM_WORLD, ierr)
  if (rank == 2) call tally(all(db == dwant))

  call MPI_Reduce(failures, all_failures, 1, MPI_INTEGER, MPI_SUM, 0, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a,i0,a,i0)', 'checks=', checks, ' failures=', all_failures
  call MPI_Finalize(ierr)
  if (rank == 0 .and. all_failures /= 0) stop 1

contains

  subroutine tally(ok)
    logical, intent(in) :: ok
    checks = checks + 1
    if (.not. ok) then
      failures = failures + 1
      print '(a,i0,a,i0)', 'rank ', rank, ': check failed: ', checks
    end if
  end subroutine tally
end program check_fortran
