use super::*;

/// A memory file counts as sealed only with every seal asked for, and
/// only at the size asked for: a peer's board or liveness page sealed
/// against growing alone could still be shrunk under its mapping
/// (SIGBUS). Guards `is_sealed_memfd`'s `have & seals == seals`.
#[test]
fn a_memfd_with_only_some_of_the_seals_is_not_sealed() {
    let grow_only = sealable_memfd(c"grow-only", 4096, "test").unwrap();
    add_seals(&grow_only, libc::F_SEAL_GROW, "test").unwrap();
    assert!(!is_sealed_memfd(&grow_only, SIZE_SEALS, 4096), "GROW alone is not SIZE_SEALS");
    let unsealed = sealable_memfd(c"unsealed", 4096, "test").unwrap();
    assert!(!is_sealed_memfd(&unsealed, SIZE_SEALS, 4096));
    let sealed = sealable_memfd(c"sealed", 4096, "test").unwrap();
    add_seals(&sealed, SIZE_SEALS | libc::F_SEAL_SEAL, "test").unwrap();
    assert!(is_sealed_memfd(&sealed, SIZE_SEALS, 4096));
    assert!(!is_sealed_memfd(&sealed, SIZE_SEALS, 8192), "another size");
}

#[test]
fn shared_host_is_rounded_zeroed_and_recognised() {
    let a = allocate_shared_host(17).unwrap();
    assert_eq!(a.len(), 17);
    assert_eq!(a.physical_len(), SHARED_ROUNDING);
    // SAFETY: the allocation maps `physical_len` bytes.
    let s = unsafe { std::slice::from_raw_parts(a.addr() as *const u8, a.physical_len() as usize) };
    assert!(s.iter().all(|b| *b == 0));
    assert_eq!(kind_of(a.addr(), 17).unwrap(), MemoryKind::SharedHost);
    assert!(kind_of(a.addr(), 18).is_err());
    assert!(matches!(allocate_shared_host(0), Err(Error::InvalidArgument(_))));
    note_registered(a.addr(), 1);
    let (a, e) = a.free().unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)));
    note_registered(a.addr(), -1);
    a.free().unwrap();
}

/// An allocation no engine has registered but an export still holds
/// (an importer may map it) is not freed: UNAVAILABLE naming the
/// export, its bytes intact; once the export lets go it is freed. An
/// engine's regions go before its exports (`RegionTable::clear` at its
/// shutdown, then the export table with the engine), so a free racing
/// an engine's drop meets exactly this state. Guards `release`'s
/// `|| e.counts.exported > 0`.
#[test]
fn an_exported_allocation_no_engine_registers_is_not_freed() {
    let a = allocate_shared_host(4096).unwrap();
    // SAFETY: the allocation maps at least 4096 writable bytes.
    unsafe { std::ptr::write_bytes(a.addr() as *mut u8, 0x5a, 4096) };
    let hold = hold_for_export(a.addr()).unwrap();
    let (a, e) = a.free().unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(e.message().contains("registered 0 time(s) and exported 1 time(s)"), "{e}");
    // SAFETY: the refused free left the mapping in place.
    assert!(unsafe { std::slice::from_raw_parts(a.addr() as *const u8, 4096) }.iter().all(|b| *b == 0x5a));
    drop(hold);
    assert_eq!(exports_of(a.addr()), 0);
    a.free().unwrap();
}

/// What keeps two GPU groups (and TCP) off one pinned allocation at
/// once: `fence_pinned_at` fences each pinned owner its addresses touch,
/// once, in address order, refuses one another group holds (at its
/// deadline), and ignores memory that is not pinned. Two pinned records
/// over heap memory stand in for cuMemHostAlloc's. Guards
/// `fence_pinned_at` and `fence`.
#[test]
fn pinned_fences_are_exclusive_once_per_allocation_in_address_order() {
    let heap = vec![0u8; 3 << 16];
    let base = heap.as_ptr() as u64;
    let pin = |at: u64| {
        let release: Release = Box::new(|_| Ok(()));
        adopt(MemoryKind::PinnedHost, at, 1 << 16, 1 << 16, Backing::Native { device: None, release })
    };
    let (lo, hi) = (pin(base), pin(base + (2 << 16)));
    let soon = || std::time::Instant::now() + std::time::Duration::from_millis(20);
    // Addresses out of order, twice in one allocation, and one plain.
    let addrs = [base + (2 << 16) + 5, base + 1, base + (1 << 16), base + 9];
    let fences = fence_pinned_at(addrs.into_iter(), soon()).unwrap();
    assert_eq!(fences.iter().map(|f| f.base).collect::<Vec<_>>(), vec![lo.addr(), hi.addr()]);
    assert!(fenced(base + 1) && fenced(base + (2 << 16)) && !fenced(base + (1 << 16)));
    let e = fence_pinned_at([base + (2 << 16)].into_iter(), soon()).unwrap_err();
    assert_eq!(e.status(), crate::error::Status::Unavailable);
    assert!(fence_pinned_at([base + (1 << 16)].into_iter(), soon()).unwrap().is_empty(), "not pinned");
    drop(fences);
    assert!(!fenced(base + 1) && !fenced(base + (2 << 16)));
    lo.free().unwrap();
    hi.free().unwrap();
}

/// The VmFlags of the mapping starting at `addr` (from /proc/self/smaps).
fn vm_flags(addr: u64) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    assert!(lines.next().is_some(), "no mapping starts at 0x{addr:x}");
    lines.find_map(|l| l.strip_prefix("VmFlags:")).unwrap().to_string()
}

/// An allocation and a second mapping of its file (as an SHM import
/// makes) lie at 2 MiB-aligned addresses, are advised for huge pages
/// (`hg` in VmFlags, where the kernel has transparent huge pages) and
/// show the same bytes. Guards `map_shared_memory`'s alignment, its
/// MADV_HUGEPAGE and `allocate_shared_host`'s use of it.
#[test]
fn shared_memory_is_mapped_aligned_and_advised_for_huge_pages() {
    let a = allocate_shared_host(3 << 20).unwrap();
    assert_eq!(a.physical_len(), 4 << 20);
    let fd = a.memfd().unwrap();
    let b = map_shared_memory(&fd, 4 << 20, false, "a test mapping").unwrap();
    assert_eq!((a.addr() % SHARED_ROUNDING, b % SHARED_ROUNDING), (0, 0));
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists();
    for at in [a.addr(), b] {
        assert_eq!(vm_flags(at).split_whitespace().any(|f| f == "hg"), thp, "VmFlags of 0x{at:x}");
    }
    // SAFETY: inside the allocation (4 MiB mapped) and the second mapping of its file.
    unsafe {
        ((a.addr() + (3 << 20) + 5) as *mut u8).write(0x5a);
        assert_eq!(((b + (3 << 20) + 5) as *const u8).read(), 0x5a);
        libc::munmap(b as *mut libc::c_void, 4 << 20);
    }
    a.free().unwrap();
}

#[test]
fn shared_memory_files_cannot_change_size_or_take_new_seals() {
    let a = allocate_shared_host(4096).unwrap();
    let fd = a.memfd().unwrap();
    for size in [0, 4096, 4 << 20] {
        // SAFETY: ftruncate on the allocation's own fd; it must fail.
        assert_ne!(unsafe { libc::ftruncate(fd, size) }, 0, "resized to {size}");
    }
    // SAFETY: fcntl on the allocation's own fd; it must fail.
    assert_ne!(unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_WRITE) }, 0);
    // SAFETY: fstat into a zeroed buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
    assert_eq!(st.st_size as u64, SHARED_ROUNDING);
    a.free().unwrap();
}

/// A handle released once cannot release the allocation made at the same
/// address after it (two racing `orbite_allocation_free` of one handle
/// reach `release` twice): "already freed", the new allocation intact.
/// mmap gives a freed range back to the next mapping of its size; a try
/// where another thread took it first is made again. Guards `release`'s
/// identity check `Arc::ptr_eq(&e.owned, &self.owned)` (by address alone,
/// the stale handle frees the new allocation).
#[test]
fn a_released_handle_cannot_free_the_next_allocation_at_its_address() {
    let mut kept = Vec::new();
    for _ in 0..50 {
        let old = allocate_shared_host(4096).unwrap();
        old.release().unwrap();
        let new = allocate_shared_host(4096).unwrap();
        if new.addr() != old.addr() {
            kept.push(new);
            continue;
        }
        let e = old.release().unwrap_err();
        assert_eq!(e.status(), crate::Status::InvalidArgument);
        assert!(e.message().contains("already freed"), "{e}");
        assert_eq!(owner_of(new.addr()).map(|o| o.base), Some(new.addr()), "the new allocation is still known");
        // SAFETY: `new` is mapped (its release above was refused), 4096 bytes.
        unsafe { (new.addr() as *mut u8).write(7) };
        drop(old);
        new.free().map_err(|(_, e)| e).unwrap();
        for k in kept {
            k.free().map_err(|(_, e)| e).unwrap();
        }
        return;
    }
    panic!("no allocation reused a freed address in 50 tries");
}

/// `len` bytes of heap memory standing in for a caller's allocation to
/// adopt (leaked: a record of it may outlive the test's assertions).
fn foreign(len: usize) -> Foreign {
    let base = Box::leak(vec![0u8; len].into_boxed_slice()).as_ptr() as u64;
    Foreign { kind: MemoryKind::Cuda, base, size: len as u64, device: Some(0), forget: Box::new(|_| Ok(())) }
}

/// Inside an adopted allocation, only ranges that lie wholly in one of its
/// adopted ranges are its memory: one starting in the adoption and
/// crossing its end is `InvalidArgument` naming the adoption, though it
/// stays inside the allocation. Guards `kind_of`'s `adopted`:
/// `addr + len <= a.addr + a.len`.
#[test]
fn a_range_crossing_the_end_of_its_adoption_is_refused() {
    let f = foreign(1 << 16);
    let base = f.base;
    let (a, _) = adopt_range(f, base + 4096, 8192).unwrap();
    assert_eq!(kind_of(base + 4096, 8192).unwrap(), MemoryKind::Cuda);
    let e = kind_of(base + 8192, 8192).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.message().contains("but in none of its adopted ranges"), "{e}");
    a.free().map_err(|(_, e)| e).unwrap();
}

/// An adoption whose allocation a peer holds exported is not freed
/// (`UNAVAILABLE`, naming the exports); once the export lets go it is.
/// Guards `release_adoption`'s `e.counts.exported > 0`.
#[test]
fn an_exported_adoption_is_not_freed() {
    let f = foreign(1 << 16);
    let base = f.base;
    let (a, _) = adopt_range(f, base, 4096).unwrap();
    let hold = hold_for_export(base).unwrap();
    let (a, e) = a.free().unwrap_err();
    assert!(matches!(e, Error::Unavailable(_)), "{e}");
    assert!(e.message().contains("is exported 1 time(s)"), "{e}");
    drop(hold);
    a.free().map_err(|(_, e)| e).unwrap();
    assert!(owner_of(base).is_none());
}

/// `owner_of` names the allocation holding an address only inside its
/// logical length: the rounding up to its physical extent is nobody's
/// (an export's extent and a region's checks start from it). Guards
/// `owner_of`'s `addr < o.addr + o.len`.
#[test]
fn an_address_in_an_allocations_rounding_has_no_owner() {
    let a = allocate_shared_host(4096).unwrap();
    assert_eq!(a.physical_len(), 2 << 20);
    let o = owner_of(a.addr() + 4095).expect("inside its logical length");
    assert_eq!((o.base, o.len, o.physical), (a.addr(), 4096, 2 << 20));
    assert!(owner_of(a.addr() + 4096).is_none(), "in the rounding");
    assert!(owner_of(a.addr() + (2 << 20) - 1).is_none(), "in the rounding");
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A second adoption inside an adopted allocation must name it as it was
/// first adopted: the same extent and the same kind. One naming another
/// kind is `InvalidArgument`, and the allocation keeps its one adoption.
/// Guards `adopt_range`'s `o.kind != f.kind`.
#[test]
fn a_second_adoption_of_another_kind_is_refused() {
    let f = foreign(1 << 16);
    let (base, size) = (f.base, f.size);
    let (a, _) = adopt_range(f, base, 4096).unwrap();
    let other = Foreign { kind: MemoryKind::PinnedHost, base, size, device: None, forget: Box::new(|_| Ok(())) };
    let e = adopt_range(other, base + 4096, 4096).err().expect("another kind refused");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
    assert!(e.message().contains("lies in a library allocation"), "{e}");
    assert_eq!(kind_of(base, 4096).unwrap(), MemoryKind::Cuda);
    a.free().map_err(|(_, e)| e).unwrap();
    assert!(owner_of(base).is_none(), "its one adoption freed, the record is gone");
}

/// An adoption may cover its whole allocation, from its first byte to
/// its last, and no byte outside it: one starting a byte before the
/// allocation, one ending a byte past it, and one of no bytes are
/// `InvalidArgument` naming the range and the allocation, and record
/// nothing. Guards `adopt_range`'s `addr < f.base`, `e > end` and `len ==
/// 0` (sweep B: with `<=` or `>=` an adoption of the whole allocation, as
/// `orbite_cuda_adopt` of a `cuMemAlloc` result makes, is refused).
#[test]
fn an_adoption_covers_its_whole_allocation_and_not_a_byte_more() {
    let size = 1u64 << 16;
    let base = foreign(size as usize).base;
    let of = || Foreign { kind: MemoryKind::Cuda, base, size, device: Some(0), forget: Box::new(|_| Ok(())) };
    for (case, addr, len) in [("a byte before", base - 1, size), ("a byte past", base, size + 1), ("no bytes", base, 0)]
    {
        let e = adopt_range(of(), addr, len).err().unwrap_or_else(|| panic!("{case}: adopted"));
        let want = format!("0x{addr:x}+{len} does not lie in its allocation 0x{base:x}+{size}");
        assert_eq!((matches!(e, Error::InvalidArgument(_)), e.message()), (true, want.as_str()), "{case}");
        assert!(owner_of(base).is_none(), "{case}: recorded");
    }
    let (a, _) = adopt_range(of(), base, size).unwrap();
    assert_eq!(kind_of(base, size).unwrap(), MemoryKind::Cuda);
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A range in a library allocation may end at its logical end, not a
/// byte past it: in a shared allocation of 4096 bytes, `[addr, addr +
/// 4096)` and its last byte alone are shared host memory, while 4097
/// bytes, or 2 from its last byte, are `InvalidArgument` naming the
/// range and the allocation. Guards `kind_of`'s `addr + len > o.addr +
/// o.len` at the bound (sweep B).
#[test]
fn a_range_may_end_at_its_allocations_logical_end_and_not_a_byte_past() {
    let a = allocate_shared_host(4096).unwrap();
    let at = a.addr();
    assert_eq!(kind_of(at, 4096).unwrap(), MemoryKind::SharedHost);
    assert_eq!(kind_of(at + 4095, 1).unwrap(), MemoryKind::SharedHost);
    for (addr, len) in [(at, 4097), (at + 4095, 2)] {
        let e = kind_of(addr, len).unwrap_err();
        let want = format!("range 0x{addr:x}+{len} crosses the end of the library allocation 0x{at:x}+4096");
        assert_eq!((matches!(e, Error::InvalidArgument(_)), e.message()), (true, want.as_str()));
    }
    a.free().map_err(|(_, e)| e).unwrap();
}

/// A registration counts on the owned allocation holding its address, up
/// to the allocation's last physical byte and not at the byte after it,
/// where other memory starts: the allocation is then still registered
/// once, not twice. Heap memory stands in for a pinned allocation and
/// the plain memory after it. Guards `note_registered`'s `addr <
/// e.owned.addr + e.owned.physical` (round 19 T17: with `<=` registering
/// the memory just past an allocation kept it from being freed).
#[test]
fn a_registration_just_past_an_allocation_is_not_counted_on_it() {
    let heap = vec![0u8; 2 << 16];
    let base = heap.as_ptr() as u64;
    let release: Release = Box::new(|_| Ok(()));
    let a = adopt(MemoryKind::PinnedHost, base, 1 << 16, 1 << 16, Backing::Native { device: None, release });
    let (last, past) = (base + (1 << 16) - 1, base + (1 << 16));
    note_registered(last, 1);
    note_registered(past, 1);
    let (a, e) = a.free().unwrap_err();
    assert!(e.message().contains("is still registered 1 time(s) and exported 0 time(s)"), "{e}");
    note_registered(last, -1);
    a.free().map_err(|(_, e)| e).unwrap();
    note_registered(past, -1);
}

/// A registration counts on the adoption whose range holds its address,
/// not on the adoption ending there: of two adjacent adoptions of one
/// allocation, a registration at the second's first byte keeps only the
/// second from being freed. Guards `adoption_at`'s `addr < a.addr +
/// a.len` (round 19 T18: with `<=` it was counted on the first, which
/// then could not be freed while the second stayed freeable).
#[test]
fn a_registration_counts_on_the_adoption_holding_it_not_the_one_ending_there() {
    let f = foreign(1 << 16);
    let (base, size) = (f.base, f.size);
    let (first, _) = adopt_range(f, base, 4096).unwrap();
    let again = Foreign { kind: MemoryKind::Cuda, base, size, device: Some(0), forget: Box::new(|_| Ok(())) };
    let (second, _) = adopt_range(again, base + 4096, 4096).unwrap();
    note_registered(base + 4096, 1);
    let (second, e) = second.free().unwrap_err();
    let want = format!("the adoption 0x{:x}+4096 is still registered 1 time(s); unregister it first", base + 4096);
    assert_eq!(e.message(), want);
    first.free().map_err(|(_, e)| e).unwrap();
    note_registered(base + 4096, -1);
    second.free().map_err(|(_, e)| e).unwrap();
    assert!(owner_of(base).is_none());
}
