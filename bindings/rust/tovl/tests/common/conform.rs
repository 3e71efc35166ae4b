//! The conformance suite of tools/conform.c, driven from Rust through the safe
//! API: the same cases (names, sizes, probes), the same random generator and
//! seeding, guards poisoned around every output, every output compared bit
//! for bit against the CPU reference, and a case that patches nothing on the
//! reference fails (nothing passes vacuously). The C library exports no
//! conformance entry point, so the cases are rebuilt here; the table this
//! gives equals `tovl conform`'s on the same seed (tests/conform.rs checks).
#![allow(dead_code)]

use tovl::sys;
use tovl::{
    build_overlay, f32_to_bf16, Backend, DeviceBuffer, EmbedHookArgs, LmHeadHookArgs, LogitsDtype, OverlayDesc,
    OverlayKernels, OverlayRows, Slots, Stream, TokenOverlaySet,
};

const GUARD_BYTES: usize = 256;
const POISON: u32 = 0xA5C3_A5C3;

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u32) -> u32 {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as u32
        }
    }
    /// Varied magnitude and sign, never all zeros (2^-12 .. 2^12).
    pub fn bf16(&mut self) -> u16 {
        let mant = 1.0f32 + self.below(1 << 20) as f32 / (1u32 << 20) as f32;
        let e = self.below(25) as i32 - 12;
        let mut v = ldexpf(mant, e);
        if self.next() & 1 != 0 {
            v = -v;
        }
        f32_to_bf16(v)
    }
}

/// x * 2^e, rounded once to f32 (as C's ldexpf).
pub fn ldexpf(x: f32, e: i32) -> f32 {
    (x as f64 * 2f64.powi(e)) as f32
}

/// A seed from the clock and pid, printed by callers so runs replay.
pub fn fresh_seed() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let mut r =
        Rng(t.as_secs().wrapping_mul(1_000_000_007) ^ t.subsec_nanos() as u64 ^ ((std::process::id() as u64) << 32));
    r.next()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum SlotKind {
    Empty,
    EmbedOnly,
    LmheadOnly,
    Both,
    LmheadNone,
}
const SLOT_KINDS: [SlotKind; 5] = [
    SlotKind::Empty,
    SlotKind::EmbedOnly,
    SlotKind::LmheadOnly,
    SlotKind::Both,
    SlotKind::LmheadNone,
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Probe {
    None,
    Zeros,
    TinyW,
    TinyX,
    Band,
    BandHalves,
}

struct Case {
    name: &'static str,
    t: u32,
    h: u32,
    vocab: u32,
    extra_ld: u32,
    max_loras: u32,
    rows_per_slot: u32,
    tied: bool,
    specials: bool,
    active_slot: bool,
    misaligned: bool,
    subnormal_dots: bool,
    hostile_slots: bool,
    probe: Probe,
}

// One line per case, in the column order of conform.c's table.
#[rustfmt::skip]
#[allow(clippy::too_many_arguments)]
const fn case(name: &'static str, t: u32, h: u32, vocab: u32, extra_ld: u32, max_loras: u32, rows_per_slot: u32,
              tied: bool, specials: bool, active_slot: bool, misaligned: bool, subnormal_dots: bool,
              hostile_slots: bool, probe: Probe) -> Case {
    Case { name, t, h, vocab, extra_ld, max_loras, rows_per_slot, tied, specials, active_slot, misaligned,
           subnormal_dots, hostile_slots, probe }
}

#[rustfmt::skip]
const HOOK_CASES: &[Case] = &[
    case("mixed_untied", 48, 256, 1000, 0, 4, 24, false, false, false, false, false, false, Probe::None),
    case("mixed_tied", 48, 256, 1000, 0, 4, 24, true, false, false, false, false, false, Probe::None),
    case("odd_sizes_h100", 37, 100, 3001, 0, 5, 17, true, false, false, false, false, false, Probe::None),
    case("odd_sizes_h257", 29, 257, 997, 3, 3, 13, false, false, false, false, false, false, Probe::None),
    case("h1000_ld_gt_vocab", 21, 1000, 509, 77, 3, 9, false, false, false, false, false, false, Probe::None),
    case("h4096", 9, 4096, 777, 0, 2, 33, true, false, false, false, false, false, Probe::None),
    case("h4104", 5, 4104, 300, 0, 2, 9, false, false, false, false, false, false, Probe::None),
    case("h5003", 4, 5003, 300, 0, 2, 9, false, false, false, false, false, false, Probe::None),
    case("h1", 16, 1, 64, 1, 2, 8, false, false, false, false, false, false, Probe::None),
    case("specials_nan_inf_negzero", 40, 300, 800, 5, 4, 20, true, true, false, false, false, false, Probe::None),
    case("active_slot", 33, 128, 400, 0, 3, 40, false, false, true, false, false, false, Probe::None),
    case("misaligned_buffers", 19, 130, 301, 1, 3, 11, true, false, false, true, false, false, Probe::None),
    case("max_loras_1", 25, 64, 256, 0, 1, 30, true, false, false, false, false, false, Probe::None),
    case("many_slots_64", 70, 72, 2048, 0, 64, 6, false, false, false, false, false, false, Probe::None),
    case("many_slots_300", 96, 64, 4096, 0, 300, 3, false, false, false, false, false, false, Probe::None),
    case("many_rows_one_slot", 6, 96, 5000, 0, 1, 1500, false, false, false, false, false, false, Probe::None),
    case("long_batch_600", 600, 24, 2000, 0, 4, 9, true, false, false, false, false, false, Probe::None),
    case("subnormal_results", 12, 64, 200, 0, 2, 10, false, false, false, false, true, false, Probe::None),
    case("slots_out_of_range", 64, 40, 300, 0, 3, 12, true, false, false, false, false, true, Probe::None),
    case("fma_subnormal_tie", 16, 257, 100, 0, 2, 8, false, false, false, false, true, false, Probe::Zeros),
    case("fma_tie_tiny_rows", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, Probe::TinyW),
    case("fma_tie_tiny_hidden", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, Probe::TinyX),
    case("fma_band_edge", 24, 512, 300, 0, 2, 12, false, false, false, false, true, false, Probe::Band),
    case("fma_band_halves", 24, 512, 300, 0, 1, 16, false, false, true, false, true, false, Probe::BandHalves),
];

struct RowdiffCase {
    name: &'static str,
    rows: u32,
    h: u32,
    tol: f32,
}

const ROWDIFF_CASES: &[RowdiffCase] = &[
    RowdiffCase {
        name: "bitwise",
        rows: 301,
        h: 256,
        tol: 0.0,
    },
    RowdiffCase {
        name: "bitwise_h100",
        rows: 97,
        h: 100,
        tol: 0.0,
    },
    RowdiffCase {
        name: "bitwise_h4099",
        rows: 33,
        h: 4099,
        tol: 0.0,
    },
    RowdiffCase {
        name: "tolerance_0.1",
        rows: 257,
        h: 264,
        tol: 0.1,
    },
    RowdiffCase {
        name: "tolerance_1e-3_h7",
        rows: 64,
        h: 7,
        tol: 1e-3,
    },
];

const HOOK_KERNELS: [&str; 3] = [
    tovl::KERNEL_EMBED_OVERLAY,
    tovl::KERNEL_LMHEAD_OVERLAY_BF16,
    tovl::KERNEL_LMHEAD_OVERLAY_F32,
];

/// One row of the table: backend, kernel, case, "passed" | "failed" | "skipped", detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub backend: String,
    pub kernel: String,
    pub case: String,
    pub result: &'static str,
    pub detail: String,
}

// ---- guarded device buffers ------------------------------------------------

struct Guarded<'b> {
    buf: DeviceBuffer<'b>,
    offset: usize,
    payload: usize,
}

impl<'b> Guarded<'b> {
    fn new<T: tovl::Element>(be: &'b Backend, init: &[T], payload: usize, offset: usize) -> tovl::Result<Self> {
        let total = GUARD_BYTES + ((offset + payload + 3) & !3) + GUARD_BYTES;
        let buf = be.alloc(total)?;
        buf.fill_u32(0, POISON, total)?;
        if !init.is_empty() {
            buf.upload(GUARD_BYTES + offset, init)?;
        }
        Ok(Guarded { buf, offset, payload })
    }
    fn data(&self) -> tovl::DevicePtr {
        self.buf.ptr().offset((GUARD_BYTES + self.offset) as u64)
    }
    fn read(&self) -> tovl::Result<Vec<u8>> {
        let mut out = vec![0u8; self.buf.len()];
        self.buf.download(0, &mut out)?;
        Ok(out)
    }
}

// ---- hook cases ----------------------------------------------------------

struct SlotData {
    kind: SlotKind,
    embed_ids: Vec<u32>,
    lm_ids: Vec<u32>,
    embed_rows: Vec<u16>,
    lm_rows: Vec<u16>,
}

struct HookInputs<'c> {
    c: &'c Case,
    ld: u32,
    slots: Vec<SlotData>,
    token_ids: Vec<u32>,
    token_slots: Vec<i32>,
    active: i32,
    hidden: Vec<u16>,
    logits_bf16: Vec<u16>,
    logits_f32: Vec<f32>,
}

fn distinct_ids(r: &mut Rng, vocab: u32, n: u32) -> Vec<u32> {
    let mut ids = Vec::with_capacity(n as usize);
    while ids.len() < n as usize {
        let id = r.below(vocab);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

fn special_bf16(r: &mut Rng) -> u16 {
    const SPECIALS: [u16; 9] = [0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001, 0x8012, 0x7F7F];
    SPECIALS[r.below(SPECIALS.len() as u32) as usize]
}

fn fill_rows(r: &mut Rng, c: &Case, rows: &mut [u16]) {
    for v in rows.iter_mut() {
        *v = r.bf16();
        if c.specials && r.below(50) == 0 {
            *v = special_bf16(r);
        }
        if c.subnormal_dots {
            // tiny values: products and sums land in the f32 subnormal range
            let m = 1.0f32 + r.below(128) as f32 / 128.0;
            let e = -66 - r.below(4) as i32;
            let x = ldexpf(m, e);
            *v = f32_to_bf16(if r.next() & 1 != 0 { x } else { -x });
        }
    }
}

/// Lane 0 holds 2^-149, then adds a 2^-150 tie: unfused 2^-149, fused 2^-148.
fn fma_probe_rows(rows: &mut [u16], count: usize, h: usize, hidden_side: bool) {
    for row in (0..count).step_by(2) {
        let p = &mut rows[row * h..(row + 1) * h];
        p.fill(0);
        p[0] = f32_to_bf16(ldexpf(1.0, if hidden_side { -74 } else { -75 }));
        p[256] = f32_to_bf16(ldexpf(1.0, -75));
    }
}

/// Subnormal ties among ordinary values in whole 256-element runs.
fn tie_probe_rows(rows: &mut [u16], count: usize, h: usize, hidden_side: bool, kind: Probe) {
    let tiny_here = hidden_side == (kind == Probe::TinyX);
    let first = if tiny_here {
        if hidden_side {
            -118
        } else {
            -89
        }
    } else if hidden_side {
        -60
    } else {
        -31
    };
    let second = if tiny_here { first - 1 } else { first };
    for row in 0..count {
        let p = &mut rows[row * h..(row + 1) * h];
        for (i, v) in p.iter_mut().enumerate() {
            *v = f32_to_bf16(if !hidden_side && (i / 256) % 2 == 1 { -1.0 } else { 1.0 });
        }
        p[0] = f32_to_bf16(ldexpf(1.0, first));
        p[256] = f32_to_bf16(ldexpf(1.0, second));
    }
}

fn band_row(rows: &mut [u16], row: usize, h: usize, exponent: i32) {
    for i in 0..h {
        let mix = ((row as u32).wrapping_mul(40503).wrapping_add(i as u32)).wrapping_mul(2_654_435_761);
        let v = ldexpf(1.0 + ((mix >> 24) & 127) as f32 / 128.0, exponent);
        rows[row * h + i] = f32_to_bf16(if mix >> 31 != 0 { -v } else { v });
    }
}

fn probe_rows(rows: &mut [u16], count: usize, h: usize, hidden_side: bool, kind: Probe) {
    match kind {
        Probe::None => {}
        Probe::Zeros => fma_probe_rows(rows, count, h, hidden_side),
        Probe::Band => {
            for row in 0..count {
                band_row(rows, row, h, if hidden_side { -60 } else { -76 });
            }
        }
        Probe::BandHalves => {
            for row in 0..count {
                let band = if hidden_side { row % 8 >= 4 } else { row % 8 < 4 };
                let e = if !band {
                    0
                } else if hidden_side {
                    -60
                } else {
                    -76
                };
                band_row(rows, row, h, e);
            }
        }
        Probe::TinyW | Probe::TinyX => tie_probe_rows(rows, count, h, hidden_side, kind),
    }
}

fn probe_fits(c: &Case) -> bool {
    match c.probe {
        Probe::None | Probe::Band | Probe::BandHalves => true,
        Probe::Zeros => c.h > 256,
        Probe::TinyW | Probe::TinyX => c.h >= 512 && c.h % 512 == 0,
    }
}

fn hook_inputs(c: &Case, seed: u64) -> HookInputs<'_> {
    let mut r = Rng::new(seed);
    let h = c.h as usize;
    let mut slots = Vec::with_capacity(c.max_loras as usize);
    for s in 0..c.max_loras {
        let mut kind = if s == 0 {
            SlotKind::Both
        } else {
            SLOT_KINDS[((s + r.below(2)) % 5) as usize]
        };
        if c.max_loras == 1 {
            kind = if c.tied { SlotKind::EmbedOnly } else { SlotKind::Both };
        }
        if c.hostile_slots {
            kind = SlotKind::Both;
        }
        let has_embed = matches!(kind, SlotKind::EmbedOnly | SlotKind::Both | SlotKind::LmheadNone);
        let has_lm = matches!(kind, SlotKind::LmheadOnly | SlotKind::Both);
        let mut n_embed = if has_embed { 1 + r.below(c.rows_per_slot) } else { 0 };
        let mut n_lm = if has_lm { 1 + r.below(c.rows_per_slot) } else { 0 };
        n_embed = n_embed.min(c.vocab);
        n_lm = n_lm.min(c.vocab);
        if c.probe == Probe::BandHalves && has_lm {
            n_lm = c.rows_per_slot;
        }
        if c.rows_per_slot >= 1000 && has_embed {
            n_embed = c.rows_per_slot;
            n_lm = if has_lm { c.rows_per_slot } else { 0 };
        }
        let embed_ids = distinct_ids(&mut r, c.vocab, n_embed);
        let lm_ids = distinct_ids(&mut r, c.vocab, n_lm);
        let mut embed_rows = vec![0u16; n_embed as usize * h];
        let mut lm_rows = vec![0u16; n_lm as usize * h];
        fill_rows(&mut r, c, &mut embed_rows);
        fill_rows(&mut r, c, &mut lm_rows);
        probe_rows(&mut embed_rows, n_embed as usize, h, false, c.probe);
        probe_rows(&mut lm_rows, n_lm as usize, h, false, c.probe);
        slots.push(SlotData {
            kind,
            embed_ids,
            lm_ids,
            embed_rows,
            lm_rows,
        });
    }
    let active = if c.active_slot { 0 } else { -1 };
    let mut token_ids = vec![0u32; c.t as usize];
    let mut token_slots = vec![0i32; c.t as usize];
    for t in 0..c.t as usize {
        let mut pick = r.below(10);
        if c.hostile_slots {
            pick = if pick < 8 { pick % 2 } else { 2 };
        }
        let mut s = match pick {
            0 => -1 - r.below(3) as i32,
            1 => {
                let far = if r.next() & 1 != 0 { 0 } else { r.below(1000) };
                (c.max_loras + far) as i32
            }
            _ => r.below(c.max_loras) as i32,
        };
        if t == 0 {
            s = 0; // row 0 always patches: no case is vacuous
        }
        token_slots[t] = s;
        let eff = if c.active_slot { active } else { s };
        let mut id = r.below(c.vocab);
        let how = r.below(10);
        if how == 0 && t > 0 {
            id = c.vocab + r.below(1000);
        } else if how == 1 && t > 0 {
            id = 0xFFFF_FFFF - r.below(4); // a negative i32 read as u32
        } else if how < 8 || t == 0 {
            // an id the row's slot overlays; for an out-of-range slot, a
            // neighbour's, so clamping or wrapping slots would patch it
            let src = if eff >= 0 && (eff as u32) < c.max_loras {
                eff as usize
            } else if eff < 0 {
                0
            } else {
                c.max_loras as usize - 1
            };
            let ids = &slots[src].embed_ids;
            if !ids.is_empty() {
                id = ids[r.below(ids.len() as u32) as usize];
            }
        }
        token_ids[t] = id;
    }
    let mut hidden = vec![0u16; c.t as usize * h];
    fill_rows(&mut r, c, &mut hidden);
    probe_rows(&mut hidden, c.t as usize, h, true, c.probe);
    let ld = c.vocab + c.extra_ld;
    let cells = c.t as usize * ld as usize;
    let mut logits_bf16 = vec![0u16; cells];
    let mut logits_f32 = vec![0f32; cells];
    for i in 0..cells {
        logits_bf16[i] = r.bf16();
        logits_f32[i] = tovl::bf16_to_f32(r.bf16()) * 1.25;
    }
    HookInputs {
        c,
        ld,
        slots,
        token_ids,
        token_slots,
        active,
        hidden,
        logits_bf16,
        logits_f32,
    }
}

fn build_set<'b>(be: &'b Backend, k: &OverlayKernels, inp: &HookInputs<'_>) -> tovl::Result<TokenOverlaySet<'b>> {
    let c = inp.c;
    let mut overlays = Vec::with_capacity(c.max_loras as usize);
    for sd in &inp.slots {
        if sd.kind == SlotKind::Empty {
            overlays.push(None);
            continue;
        }
        let has_lm = matches!(sd.kind, SlotKind::LmheadOnly | SlotKind::Both | SlotKind::LmheadNone);
        let desc = OverlayDesc {
            adapter: Some("conform"),
            vocab: c.vocab,
            hidden: c.h,
            embed: OverlayRows {
                tensor: "embed",
                ids: &sd.embed_ids,
                rows: &sd.embed_rows,
                width: c.h,
            },
            lmhead: has_lm.then_some(OverlayRows {
                tensor: "lm_head",
                ids: &sd.lm_ids,
                rows: &sd.lm_rows,
                width: c.h,
            }),
            tied: c.tied,
        };
        overlays.push(Some(build_overlay(be, k, &desc)?));
    }
    TokenOverlaySet::from_slots(be, overlays, c.max_loras as usize, c.tied)
}

/// Run one hook kernel of a case on `be`: the whole output allocation, guards
/// included, and the output's offset and payload.
fn run_hook(be: &Backend, inp: &HookInputs<'_>, kernel: &str) -> tovl::Result<(Vec<u8>, usize, usize)> {
    let c = inp.c;
    let k = OverlayKernels::new(be);
    let set = build_set(be, &k, inp)?;
    let (off16, off32) = if c.misaligned { (2, 4) } else { (0, 0) };
    let ids = Guarded::new(be, &inp.token_ids, c.t as usize * 4, 0)?;
    let slots = Guarded::new(be, &inp.token_slots, c.t as usize * 4, 0)?;
    let slot_arg = if c.active_slot {
        Slots::All(inp.active)
    } else {
        Slots::PerRow(slots.data())
    };
    let out = if kernel == tovl::KERNEL_EMBED_OVERLAY {
        let out = Guarded::new(be, &inp.hidden, c.t as usize * c.h as usize * 2, off16)?;
        let a = EmbedHookArgs {
            hidden: out.data(),
            token_ids: ids.data(),
            slots: slot_arg,
            tokens: c.t,
            hidden_size: c.h,
        };
        // SAFETY: every pointer is a guarded buffer of `be` of the size the args say, alive until the synchronize.
        unsafe { set.embed_hook(&k, &a, Stream::BACKEND)? };
        out
    } else {
        let hidden = Guarded::new(be, &inp.hidden, c.t as usize * c.h as usize * 2, off16)?;
        let cells = c.t as usize * inp.ld as usize;
        let f32 = kernel == tovl::KERNEL_LMHEAD_OVERLAY_F32;
        let out = if f32 {
            Guarded::new(be, &inp.logits_f32, cells * 4, off32)?
        } else {
            Guarded::new(be, &inp.logits_bf16, cells * 2, off16)?
        };
        let a = LmHeadHookArgs {
            logits: out.data(),
            dtype: if f32 { LogitsDtype::F32 } else { LogitsDtype::Bf16 },
            ld: inp.ld as u64,
            hidden: hidden.data(),
            slots: slot_arg,
            tokens: c.t,
            hidden_size: c.h,
        };
        // SAFETY: as the embed hook's.
        unsafe { set.lmhead_hook(&k, &a, Stream::BACKEND)? };
        out
    };
    be.synchronize(Stream::BACKEND)?;
    Ok((out.read()?, out.offset, out.payload))
}

fn guard_damage(bytes: &[u8], offset: usize, payload: usize) -> Option<usize> {
    let pat = POISON.to_le_bytes();
    let (lo, hi) = (GUARD_BYTES + offset, GUARD_BYTES + offset + payload);
    (0..bytes.len()).find(|&i| !(lo..hi).contains(&i) && bytes[i] != pat[i % 4])
}

fn err_text(e: &tovl::Error) -> String {
    format!("{}: {}", e.status().name(), e.detail())
}

fn hook_case(reference: &Backend, dut: &Backend, c: &Case, kernel: &str, seed: u64) -> (&'static str, String) {
    if !probe_fits(c) {
        return (
            "failed",
            format!(
                "case table: h = {} cannot hold this case's fused-multiply-add probe",
                c.h
            ),
        );
    }
    let inp = hook_inputs(c, seed);
    if !dut.try_kernel(kernel).is_present() {
        return ("failed", format!("kernel '{kernel}' missing on this backend"));
    }
    if c.subnormal_dots {
        if let Some(d) = dut.property("f32_denormals").filter(|d| d != "preserved") {
            return (
                "skipped",
                format!("device f32 denormals: {d} (spec allows a difference)"),
            );
        }
    }
    let (a, off, payload) = match run_hook(reference, &inp, kernel) {
        Ok(x) => x,
        Err(e) => return ("failed", format!("reference failed: {}", e.detail())),
    };
    let (b, _, _) = match run_hook(dut, &inp, kernel) {
        Ok(x) => x,
        Err(e) => return ("failed", err_text(&e)),
    };
    let embed = kernel == tovl::KERNEL_EMBED_OVERLAY;
    let f32 = kernel == tovl::KERNEL_LMHEAD_OVERLAY_F32;
    let init: Vec<u8> = if embed {
        inp.hidden.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else if f32 {
        inp.logits_f32.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        inp.logits_bf16.iter().flat_map(|v| v.to_le_bytes()).collect()
    };
    let mut detail = String::new();
    let mut fail = |d: String| {
        if detail.is_empty() {
            detail = d;
        }
    };
    if let Some(at) = guard_damage(&b, off, payload) {
        fail(format!(
            "wrote outside its output: guard byte {at} of {} changed",
            b.len()
        ));
    }
    if guard_damage(&a, off, payload).is_some() {
        fail("reference wrote outside its output".into());
    }
    let base = GUARD_BYTES + off;
    if a[base..base + payload] == init[..] {
        fail("the reference patched nothing: the case is vacuous".into());
    }
    let elem = if f32 { 4 } else { 2 };
    let row = if embed { c.h as usize } else { inp.ld as usize };
    for i in 0..payload / elem {
        let (x, y) = (
            &a[base + i * elem..base + (i + 1) * elem],
            &b[base + i * elem..base + (i + 1) * elem],
        );
        if x != y {
            let val = |s: &[u8]| s.iter().rev().fold(0u32, |acc, &v| (acc << 8) | v as u32);
            fail(format!(
                "row {} col {}: expected 0x{:0w$x}, got 0x{:0w$x}",
                i / row,
                i % row,
                val(x),
                val(y),
                w = elem * 2
            ));
            break;
        }
    }
    if detail.is_empty() {
        ("passed", detail)
    } else {
        ("failed", detail)
    }
}

// ---- rowdiff cases: launched through the vtable so flags carry guards -------

fn rowdiff_pair(c: &RowdiffCase, seed: u64) -> (Vec<u16>, Vec<u16>) {
    let mut r = Rng::new(seed);
    let h = c.h as usize;
    let a: Vec<u16> = (0..c.rows as usize * h).map(|_| r.bf16()).collect();
    let mut a = a;
    let mut b = a.clone();
    for row in 0..c.rows as usize {
        let col = row * h + r.below(c.h) as usize;
        match r.below(10) {
            0 => b[col] ^= 1,
            1 => {
                a[col] = 0x0000;
                b[col] = 0x8000;
            }
            2 => b[col] = 0x7FC0,
            3 => {
                a[col] = 0x7FC0;
                b[col] = 0xFFC1;
            }
            4 => {
                a[col] = 0x7F80;
                b[col] = 0x7F80;
            }
            5 => b[col] = f32_to_bf16(tovl::bf16_to_f32(a[col]) + 0.5),
            6 => {
                a[col] = 0x3F80;
                b[col] = 0x3F81;
            }
            7 => {
                a[col] = 0x7F80;
                b[col] = 0x4000;
            }
            _ => {}
        }
    }
    (a, b)
}

fn run_rowdiff(be: &Backend, c: &RowdiffCase, a: &[u16], b: &[u16]) -> Result<Vec<u8>, String> {
    run_rowdiff_on(be, c, a, b).map_err(|e| err_text(&e))?
}

/// Ok(Err(text)) when the launch itself failed (its detail is not a tovl::Error).
fn run_rowdiff_on(be: &Backend, c: &RowdiffCase, a: &[u16], b: &[u16]) -> tovl::Result<Result<Vec<u8>, String>> {
    let n = c.rows as usize * c.h as usize * 2;
    let k = be.try_kernel(tovl::KERNEL_ROWDIFF);
    let ga = Guarded::new(be, a, n, 0)?;
    let gb = Guarded::new(be, b, n, 0)?;
    let flags = Guarded::new::<u8>(be, &[], c.rows as usize * 4, 0)?;
    let args = sys::tovl_rowdiff_args {
        a: ga.data().0,
        b: gb.data().0,
        flags: flags.data().0,
        rows: c.rows,
        h: c.h,
        tol: c.tol,
        pad0: 0,
    };
    let grid = [c.rows, 1, 1];
    // SAFETY: the backend's own vtable and context, its rowdiff handle and
    // argument struct, over buffers of the sizes the args say.
    let code = unsafe {
        let iface = &*sys::tovl_backend_get_iface(be.as_raw());
        (iface.launch.expect("launch is a required member"))(
            sys::tovl_backend_get_context(be.as_raw()),
            k.0,
            grid.as_ptr(),
            (&args as *const sys::tovl_rowdiff_args).cast(),
            std::mem::size_of_val(&args),
            std::ptr::null_mut(),
        )
    };
    if code != sys::TOVL_OK {
        // SAFETY: the detail is this thread's.
        let detail = unsafe { std::ffi::CStr::from_ptr(sys::tovl_last_error()) };
        let name = unsafe { std::ffi::CStr::from_ptr(sys::tovl_status_str(code)) };
        return Ok(Err(format!("{}: {}", name.to_string_lossy(), detail.to_string_lossy())));
    }
    be.synchronize(Stream::BACKEND)?;
    Ok(Ok(flags.read()?))
}

fn rowdiff_case(reference: &Backend, dut: &Backend, c: &RowdiffCase, seed: u64) -> (&'static str, String) {
    if !dut.try_kernel(tovl::KERNEL_ROWDIFF).is_present() {
        return ("failed", "kernel 'rowdiff' missing on this backend".into());
    }
    let (a, b) = rowdiff_pair(c, seed);
    let fa = match run_rowdiff(reference, c, &a, &b) {
        Ok(x) => x,
        Err(e) => return ("failed", format!("reference failed: {e}")),
    };
    let fb = match run_rowdiff(dut, c, &a, &b) {
        Ok(x) => x,
        Err(e) => return ("failed", e),
    };
    let mut detail = String::new();
    if let Some(at) = guard_damage(&fb, 0, c.rows as usize * 4) {
        detail = format!("wrote outside flags: guard byte {at} changed");
    }
    let word = |v: &[u8], i: usize| {
        let o = GUARD_BYTES + i * 4;
        u32::from_le_bytes([v[o], v[o + 1], v[o + 2], v[o + 3]])
    };
    let mut differing = 0;
    for i in 0..c.rows as usize {
        differing += (word(&fa, i) == 1) as u32;
        if word(&fa, i) != word(&fb, i) && detail.is_empty() {
            detail = format!("row {i}: expected flag {}, got 0x{:08x}", word(&fa, i), word(&fb, i));
            break;
        }
    }
    if (differing == 0 || differing == c.rows) && detail.is_empty() {
        detail = format!(
            "the reference flagged {differing} of {} rows: the case is vacuous",
            c.rows
        );
    }
    if detail.is_empty() {
        ("passed", detail)
    } else {
        ("failed", detail)
    }
}

/// Every case on `dut` against `reference` (the CPU backend), in the order
/// and with the per-case seeds of `tovl conform --seed seed`.
pub fn conform_backend(reference: &Backend, dut: &Backend, seed: u64, log: bool) -> Vec<Outcome> {
    let name = dut.name();
    let mut r = Rng::new(seed);
    let mut out = Vec::new();
    let mut push = |kernel: &str, case: &str, (result, detail): (&'static str, String)| {
        if log {
            let shown = match result {
                "passed" => "ok",
                "skipped" => "SKIP",
                _ => "FAIL",
            };
            let sep = if detail.is_empty() { "" } else { ": " };
            eprintln!("conform {name:<7} {kernel:<20} {case:<26} {shown}{sep}{detail}");
        }
        out.push(Outcome {
            backend: name.clone(),
            kernel: kernel.into(),
            case: case.into(),
            result,
            detail,
        });
    };
    for c in HOOK_CASES {
        let case_seed = r.next();
        for kernel in HOOK_KERNELS {
            push(kernel, c.name, hook_case(reference, dut, c, kernel, case_seed));
        }
    }
    for c in ROWDIFF_CASES {
        let s = r.next();
        push(tovl::KERNEL_ROWDIFF, c.name, rowdiff_case(reference, dut, c, s));
    }
    out
}

/// The number of (kernel, case) rows per backend.
pub fn case_count() -> usize {
    HOOK_CASES.len() * 3 + ROWDIFF_CASES.len()
}
