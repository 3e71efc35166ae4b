//! Fixed-shape sets (`TokenOverlaySet::with_shape`): random loads and unloads
//! of random overlays, each followed by both hooks, bit-exact against a
//! `from_slots` set of the same overlays on the CPU reference, on cpu and on
//! Vulkan (lavapipe in CI; left out with its reason where absent unless CI or
//! TOVL_REQUIRE_VULKAN=1); and the refusals, each naming the value.
mod common;

use common::conform::Rng;
use common::{desc, random_rows, Rows};
use tovl::{
    build_overlay, Backend, DeviceBuffer, EmbedHookArgs, EmbedOverlay, ErrorGroup, LmHeadHookArgs, LogitsDtype,
    OverlayKernels, SetShape, Slots, Status, Stream, TokenOverlaySet,
};

const VOCAB: u32 = 384;
const H: u32 = 48;
const SLOTS: u32 = 4;
const T: u32 = 24;
const LD: u32 = VOCAB + 16;
const EMBED_CAP: u32 = 12;
const LM_CAP: u32 = 16;
const ROUNDS: u32 = 300;
const POOL: usize = 10;

/// An adapter's host rows: embed rows, and no lm_head part, an empty one
/// ("leave the lm_head alone") or rows of its own.
struct HostAdapter {
    embed: Rows,
    lm: Option<Rows>,
}

fn random_adapter(r: &mut Rng) -> HostAdapter {
    let n = r.below(EMBED_CAP + 1);
    let embed = random_rows(r, VOCAB, n, H);
    let lm = match r.below(3) {
        0 => None,
        1 => Some(random_rows(r, VOCAB, 0, H)),
        _ => {
            let m = r.below(LM_CAP + 1);
            Some(random_rows(r, VOCAB, m, H))
        }
    };
    HostAdapter { embed, lm }
}

fn build_pool<'b>(be: &'b Backend, pool: &[HostAdapter], tied: bool) -> Vec<EmbedOverlay<'b>> {
    let k = OverlayKernels::new(be);
    pool.iter()
        .map(|a| build_overlay(be, &k, &desc(VOCAB, H, &a.embed, a.lm.as_ref(), tied)).unwrap())
        .collect()
}

/// One round's hook inputs (host).
struct Inputs {
    hidden: Vec<u16>,
    ids: Vec<u32>,
    slots: Vec<i32>,
    all: Option<i32>,
    f32: bool,
    logits: Vec<u8>,
}

fn random_inputs(r: &mut Rng, pool: &[HostAdapter]) -> Inputs {
    let ids = (0..T)
        .map(|_| {
            let a = &pool[r.below(POOL as u32) as usize];
            let from = [&a.embed.ids, a.lm.as_ref().map_or(&a.embed.ids, |l| &l.ids)][r.below(2) as usize];
            if from.is_empty() || r.below(4) == 0 {
                r.below(VOCAB + 8) // some ids past the vocab
            } else {
                from[r.below(from.len() as u32) as usize]
            }
        })
        .collect();
    // -1 and SLOTS: rows without an adapter.
    let slots = (0..T).map(|_| r.below(SLOTS + 2) as i32 - 1).collect();
    let all = (r.below(4) == 0).then(|| r.below(SLOTS + 1) as i32 - 1);
    let f32 = r.below(2) == 0;
    let cells = (T * LD) as usize;
    let logits = if f32 {
        (0..cells)
            .flat_map(|_| tovl::bf16_to_f32(r.bf16()).to_bits().to_le_bytes())
            .collect()
    } else {
        (0..cells).flat_map(|_| r.bf16().to_le_bytes()).collect()
    };
    Inputs {
        hidden: (0..T * H).map(|_| r.bf16()).collect(),
        ids,
        slots,
        all,
        f32,
        logits,
    }
}

/// The hook buffers of one backend.
struct Buffers<'b> {
    hidden: DeviceBuffer<'b>,
    ids: DeviceBuffer<'b>,
    slots: DeviceBuffer<'b>,
    logits: DeviceBuffer<'b>,
}

impl<'b> Buffers<'b> {
    fn new(be: &'b Backend) -> Buffers<'b> {
        Buffers {
            hidden: be.alloc((T * H * 2) as usize).unwrap(),
            ids: be.alloc((T * 4) as usize).unwrap(),
            slots: be.alloc((T * 4) as usize).unwrap(),
            logits: be.alloc((T * LD * 4) as usize).unwrap(),
        }
    }

    /// Both hooks of `set` on `inp`: the patched hidden rows and logits, as bytes.
    fn run(&self, set: &TokenOverlaySet<'_>, k: &OverlayKernels, inp: &Inputs) -> (Vec<u8>, Vec<u8>) {
        self.hidden.upload(0, &inp.hidden).unwrap();
        self.ids.upload(0, &inp.ids).unwrap();
        self.slots.upload(0, &inp.slots).unwrap();
        self.logits.upload(0, &inp.logits).unwrap();
        let slots = inp.all.map_or(Slots::PerRow(self.slots.ptr()), Slots::All);
        let ea = EmbedHookArgs {
            hidden: self.hidden.ptr(),
            token_ids: self.ids.ptr(),
            slots,
            tokens: T,
            hidden_size: H,
        };
        let la = LmHeadHookArgs {
            logits: self.logits.ptr(),
            dtype: if inp.f32 { LogitsDtype::F32 } else { LogitsDtype::Bf16 },
            ld: LD as u64,
            hidden: self.hidden.ptr(),
            slots,
            tokens: T,
            hidden_size: H,
        };
        // SAFETY: every buffer is the set's backend's, of the sizes the args
        // say, and kept until the synchronize below.
        unsafe {
            set.embed_hook(k, &ea, Stream::BACKEND).unwrap();
            set.lmhead_hook(k, &la, Stream::BACKEND).unwrap();
        }
        set.backend().synchronize(Stream::BACKEND).unwrap();
        let mut hidden = vec![0u8; (T * H * 2) as usize];
        let mut logits = vec![0u8; inp.logits.len()];
        self.hidden.download(0, &mut hidden).unwrap();
        self.logits.download(0, &mut logits).unwrap();
        (hidden, logits)
    }
}

/// `ROUNDS` random loads, reloads and unloads on a fixed set of `dut`, half
/// untied and half tied, each followed by both hooks; every output equals a
/// fresh `from_slots` set of the same adapters on the CPU reference.
fn random_swaps_match_from_slots(dut: &Backend, seed: u64) {
    let reference = Backend::open("cpu").unwrap();
    let mut r = Rng::new(seed);
    let (k, rk) = (OverlayKernels::new(dut), OverlayKernels::new(&reference));
    let (bufs, rbufs) = (Buffers::new(dut), Buffers::new(&reference));
    let (mut embed_patched, mut lmhead_patched) = (0, 0);
    for tied in [false, true] {
        let host: Vec<HostAdapter> = (0..POOL).map(|_| random_adapter(&mut r)).collect();
        let (pool, rpool) = (build_pool(dut, &host, tied), build_pool(&reference, &host, tied));
        let shape = SetShape {
            max_loras: SLOTS,
            vocab: VOCAB,
            hidden: H,
            tied,
            embed_capacity: EMBED_CAP,
            lmhead_capacity: LM_CAP,
        };
        let set = TokenOverlaySet::with_shape(dut, &shape).unwrap();
        let tables = (set.embed_rows_table(), set.n_override_table());
        let mut held: Vec<Option<usize>> = vec![None; SLOTS as usize];
        for round in 0..ROUNDS / 2 {
            let slot = r.below(SLOTS);
            if r.below(4) == 0 {
                set.unload(slot, Stream::BACKEND).unwrap();
                held[slot as usize] = None;
            } else {
                let a = r.below(POOL as u32) as usize;
                set.load(slot, &pool[a], Stream::BACKEND).unwrap();
                held[slot as usize] = Some(a);
            }
            for (s, h) in held.iter().enumerate() {
                let got = set.slot(s as u32).map(|o| o.view());
                assert_eq!(got, h.map(|a| pool[a].view()), "slot {s} after round {round}");
            }
            let overlays = held.iter().map(|h| h.map(|a| rpool[a].clone())).collect();
            let want_set = TokenOverlaySet::from_slots(&reference, overlays, SLOTS as usize, tied).unwrap();
            let inp = random_inputs(&mut r, &host);
            let got = bufs.run(&set, &k, &inp);
            let want = rbufs.run(&want_set, &rk, &inp);
            assert!(
                got.0 == want.0 && got.1 == want.1,
                "{} tied={tied} round {round} (seed {seed}): embed equal {}, lm_head ({}) equal {}",
                dut.name(),
                got.0 == want.0,
                if inp.f32 { "f32" } else { "bf16" },
                got.1 == want.1
            );
            assert_eq!(set.any_active(), held.iter().any(Option::is_some));
            let hidden_in: Vec<u8> = inp.hidden.iter().flat_map(|w| w.to_le_bytes()).collect();
            embed_patched += usize::from(got.0 != hidden_in);
            lmhead_patched += usize::from(got.1 != inp.logits);
        }
        // The shape never moved, and what the swaps replaced is released
        // once the device has passed them.
        assert_eq!((set.embed_rows_table(), set.n_override_table()), tables);
        assert_eq!((set.max_n_override(), set.vocab(), set.hidden()), (LM_CAP, VOCAB, H));
        assert_eq!(set.lmhead_grid_y(), LM_CAP.min(64));
        dut.synchronize(Stream::BACKEND).unwrap();
        assert_eq!(set.collect().unwrap(), 0);
    }
    // Not vacuous: many rounds' hooks changed something.
    assert!(
        embed_patched > ROUNDS as usize / 4 && lmhead_patched > ROUNDS as usize / 4,
        "{}: only {embed_patched} / {lmhead_patched} of {ROUNDS} rounds patched",
        dut.name()
    );
    eprintln!(
        "{}: {ROUNDS} swaps bit-exact against from_slots on cpu; the embed hook patched {embed_patched}, \
         the lm_head hook {lmhead_patched}",
        dut.name()
    );
}

#[test]
fn random_swaps_on_cpu_match_from_slots() {
    let be = Backend::open("cpu").unwrap();
    random_swaps_match_from_slots(&be, common::seed("fixed set, cpu"));
}

#[test]
fn random_swaps_on_vulkan_match_from_slots() {
    let be = match Backend::open("vulkan") {
        Ok(be) => be,
        Err(e) => {
            assert!(!common::vulkan_required(), "Vulkan is required here: {e}");
            eprintln!("SKIP vulkan: {e}");
            return;
        }
    };
    random_swaps_match_from_slots(&be, common::seed("fixed set, vulkan"));
}

fn overlay<'b>(
    be: &'b Backend,
    r: &mut Rng,
    (vocab, h): (u32, u32),
    n: u32,
    m: Option<u32>,
    tied: bool,
) -> EmbedOverlay<'b> {
    let embed = random_rows(r, vocab, n, h);
    let lm = m.map(|m| random_rows(r, vocab, m, h));
    build_overlay(be, &OverlayKernels::new(be), &desc(vocab, h, &embed, lm.as_ref(), tied)).unwrap()
}

#[test]
fn refusals_name_the_value_and_keep_the_slot() {
    let mut r = Rng::new(common::seed("fixed set refusals"));
    let be = Backend::open("cpu").unwrap();
    let shape = SetShape {
        max_loras: 2,
        vocab: 300,
        hidden: 32,
        tied: false,
        embed_capacity: 4,
        lmhead_capacity: 6,
    };
    let set = TokenOverlaySet::with_shape(&be, &shape).unwrap();
    assert!(set.is_fixed() && !set.any_active());
    assert_eq!(set.shape(), Some(shape));
    assert_eq!(
        (set.vocab(), set.hidden(), set.max_loras(), set.max_n_override()),
        (300, 32, 2, 6)
    );
    assert!(set.overlays().is_empty() && set.slot(0).is_none());

    // The set holds its own reference: the caller's may go at once.
    let good = overlay(&be, &mut r, (300, 32), 4, Some(6), false);
    let view = good.view();
    set.load(0, &good, Stream::BACKEND).unwrap();
    drop(good);
    assert_eq!(set.slot(0).map(|o| o.view()), Some(view));

    // (vocab, hidden), embed rows, lm_head rows, tied, slot: the status and what the detail names.
    type Refusal = ((u32, u32), u32, Option<u32>, bool, u32, Status, &'static [&'static str]);
    #[rustfmt::skip]
    let cases: [Refusal; 6] = [
        ((300, 32), 5, None, false, 0, Status::Capacity, &["5 embedding rows", "at most 4", "embed_capacity"]),
        ((300, 32), 2, Some(7), false, 0, Status::Capacity, &["7 lm_head cells", "at most 6", "lmhead_capacity"]),
        ((301, 32), 2, None, false, 0, Status::VocabMismatch, &["vocab 301", "vocab 300"]),
        ((300, 16), 2, None, false, 0, Status::ShapeMismatch, &["hidden size 16", "has 32"]),
        ((300, 32), 2, None, true, 0, Status::InvalidArgument, &["tied", "untied"]),
        ((300, 32), 2, None, false, 2, Status::InvalidArgument, &["slot 2", "max_loras 2"]),
    ];
    for (size, n, m, tied, slot, status, names) in cases {
        let ov = overlay(&be, &mut r, size, n, m, tied);
        let e = set.load(slot, &ov, Stream::BACKEND).expect_err("refused");
        assert_eq!((e.status(), e.group()), (status, ErrorGroup::Caller), "{e}");
        for name in names {
            assert!(e.detail().contains(name), "{:?} names {name:?}", e.detail());
        }
        assert_eq!(
            set.slot(0).map(|o| o.view()),
            Some(view),
            "a refused load keeps the slot"
        );
        assert!(set.slot(1).is_none());
    }
    let e = set.unload(2, Stream::BACKEND).expect_err("slot out of range");
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("slot 2"), "{:?}", e.detail());
    set.unload(0, Stream::BACKEND).unwrap();
    assert!(set.slot(0).is_none() && !set.any_active());
    assert_eq!(set.collect().unwrap(), 0);

    // A tied set counts an adapter's embed rows as its lm_head cells when it
    // has no lm_head part.
    let tied = SetShape {
        tied: true,
        embed_capacity: 8,
        lmhead_capacity: 3,
        ..shape
    };
    let tied_set = TokenOverlaySet::with_shape(&be, &tied).unwrap();
    let e = tied_set
        .load(1, &overlay(&be, &mut r, (300, 32), 5, None, true), Stream::BACKEND)
        .expect_err("5 tied cells for 3");
    assert_eq!(e.status(), Status::Capacity);
    assert!(
        e.detail().contains("5 lm_head cells (its tied embedding rows)"),
        "{:?}",
        e.detail()
    );

    // A from_slots set keeps its contents.
    let ov = overlay(&be, &mut r, (300, 32), 2, None, false);
    let fixed_contents = TokenOverlaySet::from_slots(&be, vec![Some(ov.clone())], 2, false).unwrap();
    assert!(!fixed_contents.is_fixed() && fixed_contents.shape().is_none());
    assert_eq!(fixed_contents.slot(0).map(|o| o.view()), Some(ov.view()));
    assert_eq!(fixed_contents.collect().unwrap(), 0);
    for e in [
        fixed_contents
            .load(1, &ov, Stream::BACKEND)
            .expect_err("from_slots set"),
        fixed_contents.unload(0, Stream::BACKEND).expect_err("from_slots set"),
    ] {
        assert_eq!((e.status(), e.group()), (Status::InvalidArgument, ErrorGroup::Caller));
        assert!(e.detail().contains("from_slots"), "{:?}", e.detail());
    }

    // A shape field of 0 is named.
    let e = TokenOverlaySet::with_shape(&be, &SetShape { vocab: 0, ..shape }).expect_err("vocab 0");
    assert_eq!(e.status(), Status::InvalidArgument);
    assert!(e.detail().contains("shape.vocab"), "{:?}", e.detail());
}

#[test]
fn a_shard_set_covers_its_range_and_refuses_like_every_rank() {
    let mut r = Rng::new(common::seed("fixed shard set"));
    let be = Backend::open("cpu").unwrap();
    let shape = SetShape {
        max_loras: 2,
        vocab: 300,
        hidden: 32,
        tied: false,
        embed_capacity: 4,
        lmhead_capacity: 6,
    };
    let set = TokenOverlaySet::with_shape_shard(&be, &shape, 100..200).unwrap();
    assert!(set.is_fixed() && !set.any_active());
    assert_eq!((set.shard_range(), set.max_n_override()), (100..200, 6));
    let good = overlay(&be, &mut r, (300, 32), 4, Some(6), false);
    set.load(1, &good, Stream::BACKEND).unwrap();
    set.unload(1, Stream::BACKEND).unwrap();
    // The capacity counts the whole lm_head, whatever the shard holds of it.
    let big = overlay(&be, &mut r, (300, 32), 2, Some(7), false);
    let e = set.load(0, &big, Stream::BACKEND).expect_err("7 lm_head cells");
    assert_eq!(e.status(), Status::Capacity);
    assert!(set.slot(0).is_none());
    for (range, status, name) in [
        (50..50, Status::InvalidArgument, "vocab_start 50 >= vocab_end 50"),
        (300..320, Status::IdOutOfRange, "vocab_start 300 >= shape.vocab 300"),
    ] {
        let e = TokenOverlaySet::with_shape_shard(&be, &shape, range).expect_err(name);
        assert_eq!(e.status(), status);
        assert!(e.to_string().contains(name), "{e}");
    }
}
