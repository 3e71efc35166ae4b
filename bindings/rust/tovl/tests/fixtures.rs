//! The PEFT fixtures of tests/fixtures (and ../shared/fixtures/peft when
//! present) through Model / Adapter / build_overlay / the hooks, with the
//! checks of tests/test_import_fixtures.c, on the CPU backend and Vulkan:
//!   - embed equals PEFT's bit for bit;
//!   - patched logits cells are within one bf16 unit of PEFT's logits_bf16;
//!   - every other cell is exactly tovl's own base product, and close to
//!     PEFT's, so a wrong tied-model rule (a missing or extra patch) fails;
//!   - guards around every output and the ld padding columns keep their poison.
//!
//! A mixed batch of several adapters in slots, with slot -1 rows, must match
//! each adapter run alone. Adapters tovl refuses are refused with the names
//! the C tests expect.
mod common;

use std::path::{Path, PathBuf};

use tovl::{
    bf16_to_f32, f32_to_bf16, Adapter, AdapterRows, Backend, EmbedHookArgs, LmHeadHookArgs, LogitsDtype, Model,
    OverlayKernels, SafeTensors, Slots, Status, Stream, TokenOverlaySet,
};

const GUARD: usize = 16; // poisoned elements before and after every output
const POISON32: u32 = 0x7FA1_7FA1;
const POISON16: u16 = 0x7FA1;

struct Case {
    label: String,
    base: PathBuf,
    adapter: PathBuf,
    expected: PathBuf,
    padded: u32,
}

fn tsv_cases(root: &Path, prefix: &str) -> Vec<Case> {
    let text = std::fs::read_to_string(root.join("cases.tsv")).expect("cases.tsv");
    let cases: Vec<Case> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 4).then(|| Case {
                label: format!("{prefix}/{}", f[0]),
                base: root.join(f[2]),
                adapter: root.join(f[1]).join("adapter"),
                expected: root.join(f[1]).join("expected.safetensors"),
                padded: f[3].parse().expect("padded vocab"),
            })
        })
        .collect();
    assert!(cases.len() >= 10, "{} lists only {} cases", root.display(), cases.len());
    cases
}

fn committed_cases() -> Vec<Case> {
    let fx = common::repo_root().join("tests/fixtures");
    let mut v = tsv_cases(&fx.join("peft_extra"), "extra");
    v.extend(tsv_cases(&fx.join("peft_tokens"), "tokens"));
    v
}

/// PEFT's own outputs (TOVL_PEFT_FIXTURES, else ../shared/fixtures/peft beside the repo).
fn shared_cases() -> Vec<Case> {
    let dir = std::env::var("TOVL_PEFT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| common::repo_root().join("../shared/fixtures/peft"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut v: Vec<Case> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("base").is_dir() && p.join("adapter").is_dir() && p.join("expected.safetensors").exists())
        .map(|p| Case {
            label: format!("shared/{}", p.file_name().unwrap().to_string_lossy()),
            base: p.join("base"),
            adapter: p.join("adapter"),
            expected: p.join("expected.safetensors"),
            padded: 0,
        })
        .collect();
    v.sort_by(|a, b| a.label.cmp(&b.label));
    v
}

struct Expected {
    ids: Vec<u32>,
    embed: Vec<u16>,
    hidden: Vec<u16>,
    logits: Vec<u16>,
    t: usize,
    h: usize,
    vocab: usize,
}

fn expected(c: &Case) -> Expected {
    let f = SafeTensors::open(&c.expected).unwrap_or_else(|e| panic!("{}: {e}", c.label));
    let get = |n: &str| {
        f.find(n)
            .unwrap_or_else(|| panic!("{}: expected.safetensors lacks {n}", c.label))
    };
    let (ids, embed, logits) = (get("ids"), get("embed"), get("logits_bf16"));
    assert!(ids.dtype == "I32" && logits.dtype == "BF16");
    Expected {
        ids: ids.to_i32().into_iter().map(|v| v as u32).collect(),
        embed: embed.to_u16(),
        hidden: get("hidden").to_u16(),
        logits: logits.to_u16(),
        t: ids.shape[0] as usize,
        h: embed.shape[1] as usize,
        vocab: logits.shape[1] as usize,
    }
}

/// bf16 patterns on one ordered integer line; the distance is in bf16 units.
fn bf16_units(a: u16, b: u16) -> u32 {
    let key = |b: u16| {
        if b & 0x8000 != 0 {
            -((b & 0x7FFF) as i32)
        } else {
            b as i32
        }
    };
    (key(a) - key(b)).unsigned_abs()
}

/// The lm_head ids a slot patches: its own part, or under tying its embed ids.
fn lm_ids<'a>(rows: &'a AdapterRows<'_>) -> &'a [u32] {
    rows.lmhead_ids()
}

#[derive(Default)]
struct Counts {
    embed_rows_patched: usize,
    logits_cells_changed: usize,
}

fn run_case(be: &Backend, k: &OverlayKernels, c: &Case) -> Result<Counts, String> {
    let model = Model::open(&c.base, c.padded).map_err(|e| format!("{}: {e}", c.label))?;
    let adapter = Adapter::open(&c.adapter).map_err(|e| format!("{}: {e}", c.label))?;
    let rows = adapter
        .resolve(be, k, &model)
        .map_err(|e| format!("{}: {e}", c.label))?;
    let overlay = rows.build_overlay(be, k).map_err(|e| format!("{}: {e}", c.label))?;
    let set = TokenOverlaySet::from_slots(be, vec![Some(overlay)], 1, model.tied()).map_err(|e| e.to_string())?;
    let e = expected(c);
    let what = format!("{} on {}", c.label, be.name());
    if e.h != model.hidden() as usize || e.vocab != model.vocab() as usize {
        return Err(format!("{what}: expected.safetensors shapes disagree with the model"));
    }
    let desc = rows.desc();
    let mut n = Counts::default();

    // Embedding: base gather, then the hook (per-row slots, all 0).
    let body = e.t * e.h;
    let mut host = vec![POISON16; body + 2 * GUARD];
    for t in 0..e.t {
        host[GUARD + t * e.h..GUARD + (t + 1) * e.h].copy_from_slice(model.embed_row(e.ids[t]).unwrap());
    }
    let d_embed = be.alloc(host.len() * 2).unwrap();
    d_embed.upload(0, &host).unwrap();
    let d_ids = be.alloc(e.t * 4).unwrap();
    d_ids.upload(0, &e.ids).unwrap();
    let d_slots = be.alloc(e.t * 4).unwrap();
    d_slots.upload(0, &vec![0i32; e.t]).unwrap();
    let ea = EmbedHookArgs {
        hidden: d_embed.ptr().offset((GUARD * 2) as u64),
        token_ids: d_ids.ptr(),
        slots: Slots::PerRow(d_slots.ptr()),
        tokens: e.t as u32,
        hidden_size: e.h as u32,
    };
    // SAFETY: the buffers are this backend's, of the sizes the args say, alive past the synchronize.
    unsafe { set.embed_hook(k, &ea, Stream::BACKEND) }.map_err(|e| format!("{what}: {e}"))?;
    be.synchronize(Stream::BACKEND).unwrap();
    d_embed.download(0, &mut host).unwrap();
    if let Some(i) = (0..host.len()).find(|&i| !(GUARD..GUARD + body).contains(&i) && host[i] != POISON16) {
        return Err(format!("{what}: guard element {i} overwritten (0x{:04x})", host[i]));
    }
    for t in 0..e.t {
        let (g, x) = (
            &host[GUARD + t * e.h..GUARD + (t + 1) * e.h],
            &e.embed[t * e.h..(t + 1) * e.h],
        );
        if let Some(i) = (0..e.h).find(|&i| g[i] != x[i]) {
            return Err(format!(
                "{what}: embed row {t} (id {}) element {i}: 0x{:04x}, PEFT 0x{:04x}",
                e.ids[t], g[i], x[i]
            ));
        }
        n.embed_rows_patched += desc.embed.ids.contains(&e.ids[t]) as usize;
    }

    // Logits: base product, then the hook; ld > vocab to catch stride bugs;
    // one active slot instead of a slot array.
    let base = model.lmhead_product(&e.hidden, e.t as u32).unwrap();
    let d_hidden = be.alloc(e.hidden.len() * 2).unwrap();
    d_hidden.upload(0, &e.hidden).unwrap();
    let ld = e.vocab + 3;
    let mut patched = vec![false; e.vocab];
    for &id in lm_ids(&rows) {
        patched[id as usize] = true;
    }
    for dtype in [LogitsDtype::Bf16, LogitsDtype::F32] {
        let elem = if dtype == LogitsDtype::F32 { 4 } else { 2 };
        let lead = GUARD * 2 / elem; // elements of guard before the body
        let total_words = (e.t * ld * elem + 2 * GUARD * 2).div_ceil(4);
        let mut words = vec![POISON32; total_words];
        {
            let bytes: &mut [u8] = bytemuck_bytes(&mut words);
            for t in 0..e.t {
                for v in 0..e.vocab {
                    let b = base[t * e.vocab + v];
                    let at = (lead + t * ld + v) * elem;
                    if dtype == LogitsDtype::F32 {
                        bytes[at..at + 4].copy_from_slice(&b.to_le_bytes());
                    } else {
                        bytes[at..at + 2].copy_from_slice(&f32_to_bf16(b).to_le_bytes());
                    }
                }
            }
        }
        let d_logits = be.alloc(words.len() * 4).unwrap();
        d_logits.upload(0, &words).unwrap();
        let la = LmHeadHookArgs {
            logits: d_logits.ptr().offset((lead * elem) as u64),
            dtype,
            ld: ld as u64,
            hidden: d_hidden.ptr(),
            slots: Slots::All(0),
            tokens: e.t as u32,
            hidden_size: e.h as u32,
        };
        // SAFETY: as the embed hook's.
        unsafe { set.lmhead_hook(k, &la, Stream::BACKEND) }.map_err(|e| format!("{what}: {e}"))?;
        be.synchronize(Stream::BACKEND).unwrap();
        d_logits.download(0, &mut words).unwrap();
        let what = format!("{what}, {dtype:?} logits");
        let body = lead * elem..(lead + e.t * ld) * elem;
        if let Some(i) = (0..words.len()).find(|&i| !body.contains(&(i * 4)) && words[i] != POISON32) {
            return Err(format!("{what}: guard word {i} overwritten"));
        }
        let bytes: &[u8] = bytemuck_bytes(&mut words);
        let cell = |t: usize, v: usize| -> (u16, bool, u32) {
            let at = (lead + t * ld + v) * elem;
            if dtype == LogitsDtype::F32 {
                let f = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
                (
                    f32_to_bf16(f),
                    v < e.vocab && f.to_bits() == base[t * e.vocab + v].to_bits(),
                    f.to_bits(),
                )
            } else {
                let b = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
                (b, v < e.vocab && b == f32_to_bf16(base[t * e.vocab + v]), b as u32)
            }
        };
        for t in 0..e.t {
            for v in e.vocab..ld {
                let (_, _, raw) = cell(t, v);
                let poison = if elem == 4 { POISON32 } else { POISON16 as u32 };
                if raw != poison {
                    return Err(format!("{what}: padding column {v} of row {t} written"));
                }
            }
            for (v, &overridden) in patched.iter().enumerate() {
                let (mine, same_as_base, _) = cell(t, v);
                let peft = e.logits[t * e.vocab + v];
                if overridden {
                    n.logits_cells_changed += !same_as_base as usize;
                    if bf16_units(mine, peft) > 1 {
                        return Err(format!(
                            "{what}: patched logits[{t}][{v}]: {}, PEFT {} ({} bf16 units apart)",
                            bf16_to_f32(mine),
                            bf16_to_f32(peft),
                            bf16_units(mine, peft)
                        ));
                    }
                } else if !same_as_base {
                    return Err(format!(
                        "{what}: logits[{t}][{v}] is not patched but differs from the base product"
                    ));
                } else {
                    // cancellation makes tiny cells differ by more than a unit between summation orders
                    let diff = (bf16_to_f32(mine) - bf16_to_f32(peft)).abs();
                    if bf16_units(mine, peft) > 1 && diff > 1e-4 {
                        return Err(format!(
                            "{what}: logits[{t}][{v}] = base {} but PEFT computes {}: a patch is missing",
                            bf16_to_f32(mine),
                            bf16_to_f32(peft)
                        ));
                    }
                }
            }
        }
    }
    if n.embed_rows_patched + n.logits_cells_changed == 0 {
        return Err(format!("{what}: nothing was patched"));
    }
    if !lm_ids(&rows).is_empty() && n.logits_cells_changed == 0 {
        return Err(format!("{what}: lm_head rows exist but no logits cell changed"));
    }
    Ok(n)
}

/// u32 words as bytes (little-endian host), without a crate.
fn bytemuck_bytes(words: &mut [u32]) -> &mut [u8] {
    // SAFETY: u8 has no alignment or validity requirement; the length is exact.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 4) }
}

fn open_or_skip(name: &str) -> Option<Backend> {
    match Backend::open(name) {
        Ok(b) => Some(b),
        Err(e) => {
            assert!(
                name != "vulkan" || !common::vulkan_required(),
                "a Vulkan device is required here (CI or TOVL_REQUIRE_VULKAN=1): {e}"
            );
            eprintln!("SKIP {name}: {e}");
            None
        }
    }
}

fn run_all(name: &str, cases: &[Case]) {
    let Some(be) = open_or_skip(name) else { return };
    let k = OverlayKernels::new(&be);
    let failures: Vec<String> = cases.iter().filter_map(|c| run_case(&be, &k, c).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("fixtures: {} cases on {name}", cases.len());
}

#[test]
fn committed_fixtures_cpu() {
    run_all("cpu", &committed_cases());
}

#[test]
fn committed_fixtures_vulkan() {
    run_all("vulkan", &committed_cases());
}

#[test]
fn shared_fixtures_cpu_and_vulkan() {
    let cases = shared_cases();
    if cases.is_empty() {
        eprintln!("SKIP: no PEFT fixtures at ../shared/fixtures/peft (or TOVL_PEFT_FIXTURES)");
        return;
    }
    run_all("cpu", &cases);
    run_all("vulkan", &cases);
}

#[test]
#[ignore = "needs a CUDA device: the GPU suite runs it (scripts/gpu/rust.sh)"]
fn committed_fixtures_cuda() {
    if let Err(e) = Backend::open("cuda") {
        panic!("a CUDA device is required for this test: {e}");
    }
    run_all("cuda", &committed_cases());
    mixed_batch("cuda", TIED_MIX);
    mixed_batch("cuda", ADDED_TIED_MIX);
}

// ---- a mixed batch: several adapters in slots, and base rows ---------------

/// Embed rows and f32 logits of one forward over `ids`/`hidden` with `slots`
/// (None: every row slot 0).
fn forward(
    be: &Backend,
    k: &OverlayKernels,
    model: &Model,
    set: &TokenOverlaySet<'_>,
    ids: &[u32],
    hidden: &[u16],
    slots: Option<&[i32]>,
) -> (Vec<u16>, Vec<f32>) {
    let (t, h, vocab) = (ids.len(), model.hidden() as usize, model.vocab() as usize);
    let mut embed = Vec::with_capacity(t * h);
    for &id in ids {
        embed.extend_from_slice(model.embed_row(id).unwrap());
    }
    let mut logits = model.lmhead_product(hidden, t as u32).unwrap();
    let d_embed = be.alloc(embed.len() * 2).unwrap();
    d_embed.upload(0, &embed).unwrap();
    let d_ids = be.alloc(t * 4).unwrap();
    d_ids.upload(0, ids).unwrap();
    let d_slots = be.alloc(t * 4).unwrap();
    let slot_arg = match slots {
        Some(s) => {
            d_slots.upload(0, s).unwrap();
            Slots::PerRow(d_slots.ptr())
        }
        None => Slots::All(0),
    };
    let d_hidden = be.alloc(hidden.len() * 2).unwrap();
    d_hidden.upload(0, hidden).unwrap();
    let d_logits = be.alloc(logits.len() * 4).unwrap();
    d_logits.upload(0, &logits).unwrap();
    let ea = EmbedHookArgs {
        hidden: d_embed.ptr(),
        token_ids: d_ids.ptr(),
        slots: slot_arg,
        tokens: t as u32,
        hidden_size: h as u32,
    };
    let la = LmHeadHookArgs {
        logits: d_logits.ptr(),
        dtype: LogitsDtype::F32,
        ld: vocab as u64,
        hidden: d_hidden.ptr(),
        slots: slot_arg,
        tokens: t as u32,
        hidden_size: h as u32,
    };
    // SAFETY: the buffers are this backend's, of the sizes the args say, alive past the synchronize.
    unsafe {
        set.embed_hook(k, &ea, Stream::BACKEND).unwrap();
        set.lmhead_hook(k, &la, Stream::BACKEND).unwrap();
    }
    be.synchronize(Stream::BACKEND).unwrap();
    d_embed.download(0, &mut embed).unwrap();
    d_logits.download(0, &mut logits).unwrap();
    (embed, logits)
}

fn mixed_batch(name: &str, labels: &[&str]) {
    let Some(be) = open_or_skip(name) else { return };
    let k = OverlayKernels::new(&be);
    let all = committed_cases();
    let cases: Vec<&Case> = labels
        .iter()
        .map(|l| {
            all.iter()
                .find(|c| c.label == *l)
                .unwrap_or_else(|| panic!("{l} not listed"))
        })
        .collect();
    let model = Model::open(&cases[0].base, cases[0].padded).unwrap();
    let adapters: Vec<Adapter> = cases.iter().map(|c| Adapter::open(&c.adapter).unwrap()).collect();
    let overlays: Vec<_> = adapters
        .iter()
        .map(|a| a.build_overlay(&be, &k, &model).unwrap())
        .collect();
    let n = overlays.len();
    let seed = common::seed(&format!("mixed batch on {name}"));
    let mut r = common::conform::Rng::new(seed);
    let (h, vocab) = (model.hidden() as usize, model.vocab());
    // Rows: each slot's overlaid ids and random ones, and slot -1 rows.
    let mut ids = Vec::new();
    let mut slots = Vec::new();
    for (s, ov) in overlays.iter().enumerate() {
        let _ = ov;
        for j in 0..4 {
            let desc_ids: Vec<u32> = adapters[s].resolve(&be, &k, &model).unwrap().desc().embed.ids.to_vec();
            let id = if j < 2 && !desc_ids.is_empty() {
                desc_ids[r.below(desc_ids.len() as u32) as usize]
            } else {
                r.below(vocab)
            };
            ids.push(id);
            slots.push(s as i32);
        }
    }
    for _ in 0..4 {
        ids.push(r.below(vocab));
        slots.push(-1);
    }
    let hidden: Vec<u16> = (0..ids.len() * h).map(|_| r.bf16()).collect();
    let set = TokenOverlaySet::from_slots(&be, overlays.iter().cloned().map(Some).collect(), n, model.tied()).unwrap();
    assert!(set.any_active());
    let (me, ml) = forward(&be, &k, &model, &set, &ids, &hidden, Some(&slots));
    let none = vec![-1i32; ids.len()];
    let (be_e, be_l) = forward(&be, &k, &model, &set, &ids, &hidden, Some(&none));
    let v = vocab as usize;
    let mut differs = 0;
    for (t, &s) in slots.iter().enumerate() {
        let (want_e, want_l) = if s < 0 {
            (be_e[t * h..(t + 1) * h].to_vec(), be_l[t * v..(t + 1) * v].to_vec())
        } else {
            let one =
                TokenOverlaySet::from_slots(&be, vec![Some(overlays[s as usize].clone())], 1, model.tied()).unwrap();
            let (e1, l1) = forward(&be, &k, &model, &one, &ids[t..t + 1], &hidden[t * h..(t + 1) * h], None);
            (e1, l1)
        };
        assert_eq!(
            &me[t * h..(t + 1) * h],
            &want_e[..],
            "{name}: row {t} (slot {s}) embed differs from alone"
        );
        let got: Vec<u32> = ml[t * v..(t + 1) * v].iter().map(|f| f.to_bits()).collect();
        let want: Vec<u32> = want_l.iter().map(|f| f.to_bits()).collect();
        assert_eq!(got, want, "{name}: row {t} (slot {s}) logits differ from alone");
        differs += (me[t * h..(t + 1) * h] != be_e[t * h..(t + 1) * h]
            || got[..] != be_l[t * v..(t + 1) * v].iter().map(|f| f.to_bits()).collect::<Vec<_>>()[..])
            as usize;
    }
    assert!(differs > 0, "{name}: no row differs from the base model");
}

const TIED_MIX: &[&str] = &[
    "extra/tt_dict_both_tied_diff",
    "extra/mts_embed_tied",
    "extra/tt_f16_delta_tied",
    "extra/mts_lm_tied",
    "extra/tt_dict_lm_tied",
];
const UNTIED_MIX: &[&str] = &[
    "extra/tt_dict_both_untied",
    "extra/mts_both_untied",
    "extra/tt_dict_lm_untied",
    "extra/mts_embed_untied",
];
const ADDED_TIED_MIX: &[&str] = &[
    "tokens/added_method_tied",
    "tokens/added_lora_list_tied",
    "tokens/method_lm_tied",
];

#[test]
fn mixed_batch_cpu() {
    mixed_batch("cpu", TIED_MIX);
    mixed_batch("cpu", UNTIED_MIX);
    mixed_batch("cpu", ADDED_TIED_MIX);
}

#[test]
fn mixed_batch_vulkan() {
    mixed_batch("vulkan", TIED_MIX);
    mixed_batch("vulkan", UNTIED_MIX);
}

// ---- adapters tovl refuses ---------------------------------------------------

/// PEFT saves a standalone adapter targeting both modules of a tied model,
/// then cannot run it: tovl refuses it at open, naming file, tensor and rule.
#[test]
fn refused_method_both_tied() {
    let dir = common::repo_root().join("tests/fixtures/peft_tokens/refused/method_both_tied/adapter");
    let e = Adapter::open(&dir).expect_err("refused");
    assert_eq!(e.status(), Status::Unsupported);
    for want in [
        "adapter_model.safetensors",
        "lm_head.base_layer.trainable_tokens_delta",
        "tied model",
    ] {
        assert!(e.detail().contains(want), "detail {:?} lacks {want:?}", e.detail());
    }
}

/// Added tokens need a served vocab that holds them: below it the ids are
/// refused naming the tensor, the id, vocab_size and the served vocab.
#[test]
fn refused_added_ids_beyond_the_served_vocab() {
    let all = committed_cases();
    let c = all
        .iter()
        .find(|c| c.label == "tokens/added_lora_dict_untied")
        .expect("listed");
    let cpu = Backend::open("cpu").unwrap();
    let k = OverlayKernels::new(&cpu);
    let a = Adapter::open(&c.adapter).unwrap();
    for (padded, served, id) in [(0, "served vocab 131", "id 131"), (135, "served vocab 135", "id 135")] {
        let m = Model::open(&c.base, padded).unwrap();
        let e = a.resolve(&cpu, &k, &m).expect_err("refused");
        assert_eq!(e.status(), Status::IdOutOfRange);
        for want in [
            "model.embed_tokens.token_adapter.trainable_tokens_delta",
            id,
            served,
            "vocab_size is 131",
        ] {
            assert!(e.detail().contains(want), "detail {:?} lacks {want:?}", e.detail());
        }
    }
}
