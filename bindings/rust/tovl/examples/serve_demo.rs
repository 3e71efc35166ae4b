//! Serves one mixed batch of the small PEFT adapters in tests/fixtures the way
//! a Rust engine would (the twin of `make run`'s scripts/serve-demo.py): one
//! adapter per slot plus rows of the base model, the embed hook after the
//! embedding gather and the lm_head hook after the base lm_head product, then
//! prints what each slot patched and checks every row and cell the batch does
//! not patch against the base model.
//!
//!   cargo run --example serve_demo -- [--backend NAME] [--seed N]
//!
//! Exit 1 when an unpatched row or cell differs, 2 on bad usage or a failure.
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use tovl::{
    Adapter, Backend, EmbedHookArgs, LmHeadHookArgs, LogitsDtype, Model, OverlayKernels, Slots, Stream, TokenOverlaySet,
};

/// One adapter per slot, all on the untied base: trainable tokens (embed and
/// lm_head, lm_head only, a bf16 delta) and modules_to_save (embed, lm_head, both).
const ADAPTERS: [&str; 6] = [
    "tt_dict_both_untied",
    "tt_dict_lm_untied",
    "tt_bf16_delta_untied",
    "mts_embed_untied",
    "mts_lm_untied",
    "mts_both_untied",
];
const ROWS_PER_SLOT: usize = 3; // of which up to 2 are ids the slot's adapter overlays
const BASE_ROWS: usize = 4; // rows of the base model (slot -1)

/// splitmix64, so a printed seed replays the batch.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// bf16 of magnitude 2^-8 .. 2^8, random sign, never zero.
    fn bf16(&mut self) -> u16 {
        let r = self.next();
        (((r & 1) << 15) | ((119 + (r >> 1) % 16) << 7) | ((r >> 8) & 127)) as u16
    }
}

struct Slot {
    name: &'static str,
    embed_ids: Vec<u32>,
    lmhead_ids: Vec<u32>,
}

fn main() -> ExitCode {
    let mut backend = "cpu".to_string();
    let mut seed = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--backend", Some(v)) => backend = v,
            ("--seed", Some(v)) if v.parse::<u64>().is_ok() => seed = v.parse().ok(),
            _ => {
                eprintln!("usage: serve_demo [--backend NAME] [--seed N]");
                return ExitCode::from(2);
            }
        }
    }
    let seed = seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        Rng(t.as_nanos() as u64 ^ ((std::process::id() as u64) << 32)).next() >> 32
    });
    match serve(&backend, seed) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("serve_demo: {e}");
            ExitCode::from(2)
        }
    }
}

fn serve(backend: &str, seed: u64) -> tovl::Result<bool> {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/fixtures/peft_extra");
    let base_dir = fixtures.join("bases/untied");
    let mut rng = Rng(seed);

    // Model construction: the backend, its kernels, the base model, one
    // overlay per adapter slot, and the pool's tables.
    let gpu = Backend::open(backend)?;
    let kernels = OverlayKernels::new(&gpu);
    let model = Model::open(&base_dir, 0)?;
    let (vocab, hidden) = (model.vocab() as usize, model.hidden() as usize);
    let mut slots = Vec::new();
    let mut overlays = Vec::new();
    for name in ADAPTERS {
        let adapter = Adapter::open(fixtures.join(name).join("adapter"))?;
        let rows = adapter.resolve(&gpu, &kernels, &model)?;
        slots.push(Slot {
            name,
            embed_ids: rows.desc().embed.ids.to_vec(),
            lmhead_ids: rows.lmhead_ids().to_vec(),
        });
        overlays.push(Some(rows.build_overlay(&gpu, &kernels)?));
    }
    let set = TokenOverlaySet::from_slots(&gpu, overlays, ADAPTERS.len(), model.tied())?;
    assert!(set.any_active(), "an engine keeps only active sets");

    // The batch: each slot's rows (some of its overlaid ids, some not), then
    // the base rows, shuffled as an engine's batch would be.
    let mut batch: Vec<(u32, i32)> = Vec::new();
    for (s, slot) in slots.iter().enumerate() {
        let mut hits = slot.embed_ids.clone();
        let mut taken = 0;
        while taken < 2.min(hits.len()) {
            let id = hits.swap_remove(rng.below(hits.len()));
            batch.push((id, s as i32));
            taken += 1;
        }
        while batch.iter().filter(|&&(_, bs)| bs == s as i32).count() < ROWS_PER_SLOT {
            let id = rng.below(vocab) as u32;
            if !slot.embed_ids.contains(&id) {
                batch.push((id, s as i32));
            }
        }
    }
    for _ in 0..BASE_ROWS {
        batch.push((rng.below(vocab) as u32, -1));
    }
    for i in (1..batch.len()).rev() {
        batch.swap(i, rng.below(i + 1));
    }
    let t = batch.len();
    let ids: Vec<u32> = batch.iter().map(|b| b.0).collect();
    let row_slots: Vec<i32> = batch.iter().map(|b| b.1).collect();
    let final_hidden: Vec<u16> = (0..t * hidden).map(|_| rng.bf16()).collect();

    // The engine's forward pass: embedding gather, embed hook; ... ; base
    // lm_head product, lm_head hook.
    let mut embed: Vec<u16> = Vec::with_capacity(t * hidden);
    for &id in &ids {
        embed.extend_from_slice(model.embed_row(id).expect("id below the vocab"));
    }
    let base_logits = model.lmhead_product(&final_hidden, t as u32)?;
    let d_embed = gpu.alloc(embed.len() * 2)?;
    let d_ids = gpu.alloc(t * 4)?;
    let d_slots = gpu.alloc(t * 4)?;
    let d_hidden = gpu.alloc(final_hidden.len() * 2)?;
    let d_logits = gpu.alloc(base_logits.len() * 4)?;
    d_embed.upload(0, &embed)?;
    d_ids.upload(0, &ids)?;
    d_slots.upload(0, &row_slots)?;
    d_hidden.upload(0, &final_hidden)?;
    d_logits.upload(0, &base_logits)?;
    let start = Instant::now();
    // SAFETY: every pointer is a buffer of `gpu` holding what the args say,
    // alive until the synchronize below.
    unsafe {
        set.embed_hook(
            &kernels,
            &EmbedHookArgs {
                hidden: d_embed.ptr(),
                token_ids: d_ids.ptr(),
                slots: Slots::PerRow(d_slots.ptr()),
                tokens: t as u32,
                hidden_size: hidden as u32,
            },
            Stream::BACKEND,
        )?;
        set.lmhead_hook(
            &kernels,
            &LmHeadHookArgs {
                logits: d_logits.ptr(),
                dtype: LogitsDtype::F32,
                ld: vocab as u64,
                hidden: d_hidden.ptr(),
                slots: Slots::PerRow(d_slots.ptr()),
                tokens: t as u32,
                hidden_size: hidden as u32,
            },
            Stream::BACKEND,
        )?;
    }
    gpu.synchronize(Stream::BACKEND)?;
    let hooks_us = start.elapsed().as_secs_f64() * 1e6;
    let mut out_embed = vec![0u16; embed.len()];
    let mut out_logits = vec![0f32; base_logits.len()];
    d_embed.download(0, &mut out_embed)?;
    d_logits.download(0, &mut out_logits)?;

    println!(
        "serve_demo: one mixed batch of {t} rows, {} adapters, through the tovl crate (backend {}, seed {seed}; \
         replay with --seed {seed})",
        ADAPTERS.len(),
        gpu.name()
    );
    println!("base model: tests/fixtures/peft_extra/bases/untied (vocab {vocab}, hidden {hidden})");
    println!(
        "  {:<5} {:<22} {:>4} {:>19} {:>24}",
        "slot", "adapter", "rows", "embed rows patched", "logits cells recomputed"
    );
    let (mut total_rows, mut total_cells) = (0, 0);
    let mut expect_patched = vec![false; t];
    for s in -1..slots.len() as i32 {
        let mine: Vec<usize> = (0..t).filter(|&r| row_slots[r] == s).collect();
        let (label, hit, cells) = if s < 0 {
            ("(no adapter)", 0, 0)
        } else {
            let slot = &slots[s as usize];
            let hit: Vec<usize> = mine
                .iter()
                .copied()
                .filter(|&r| slot.embed_ids.contains(&ids[r]))
                .collect();
            for &r in &hit {
                expect_patched[r] = true;
            }
            (slot.name, hit.len(), mine.len() * slot.lmhead_ids.len())
        };
        total_rows += hit;
        total_cells += cells;
        let shown = if s < 0 { "base".to_string() } else { s.to_string() };
        println!("  {shown:<5} {label:<22} {:>4} {hit:>19} {cells:>24}", mine.len());
    }
    println!("  {:<5} {:<22} {t:>4} {total_rows:>19} {total_cells:>24}", "all", "");

    // Every row not patched holds the base embedding row; every logits cell
    // outside the row's slot's lm_head ids holds the base product.
    let wrong_rows: Vec<usize> = (0..t)
        .filter(|&r| {
            let row = &out_embed[r * hidden..(r + 1) * hidden];
            let base = &embed[r * hidden..(r + 1) * hidden];
            !expect_patched[r] && row != base
        })
        .collect();
    let mut wrong_cells = 0;
    for r in 0..t {
        let lm: &[u32] = if row_slots[r] >= 0 {
            &slots[row_slots[r] as usize].lmhead_ids
        } else {
            &[]
        };
        for v in 0..vocab {
            let same = out_logits[r * vocab + v].to_bits() == base_logits[r * vocab + v].to_bits();
            wrong_cells += (!same && !lm.contains(&(v as u32))) as usize;
        }
    }
    println!(
        "{} rows left as the base model's embedding: {}",
        t - total_rows,
        if wrong_rows.is_empty() {
            "all equal".to_string()
        } else {
            format!("{} DIFFER (rows {wrong_rows:?})", wrong_rows.len())
        }
    );
    println!(
        "logits cells outside the overlays: {}",
        if wrong_cells == 0 {
            "all the base product".to_string()
        } else {
            format!("{wrong_cells} DIFFER")
        }
    );
    println!("both hooks took {hooks_us:.0} us wall clock, synchronize included");
    Ok(wrong_rows.is_empty() && wrong_cells == 0)
}
