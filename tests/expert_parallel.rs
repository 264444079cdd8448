//! Expert parallelism on the host (issue 13): placement math and its validation errors, the dispatch plan (the
//! CPU reference of the device dispatch), the full EP step against the one-GPU reference, and the EP sizing.

use half::bf16;
use moe_gemm::dtype::DType;
use moe_gemm::layer::{LayerShape, WeightFormat};
use moe_gemm::parallel::{DispatchPlan, EpSizing, ExpertSlot, Placement};
use moe_gemm::reference::ep_forward_reference;
use moe_gemm::reference::moe_forward;
use moe_gemm::{Error, ExpertFormat, PackedExperts};

struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn unit(&mut self) -> f32 {
        (self.next() % 2001) as f32 / 1000.0 - 1.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn err(r: Result<impl std::fmt::Debug, Error>) -> String {
    match r {
        Err(Error::InvalidProblem(s)) => s,
        other => panic!("expected InvalidProblem, got {other:?}"),
    }
}

fn slot(rank: usize, local: usize) -> ExpertSlot {
    ExpertSlot { rank, local }
}

#[test]
fn contiguous_placement_math() {
    let p = Placement::contiguous(256, 8).unwrap();
    assert_eq!((p.experts(), p.world(), p.max_local_experts()), (256, 8, 32));
    for r in 0..8 {
        assert_eq!(p.local_experts(r), 32);
        let map = p.expert_map(r);
        assert_eq!(map.len(), 256);
        for (e, &l) in map.iter().enumerate() {
            let want = if e / 32 == r { (e % 32) as i32 } else { -1 };
            assert_eq!(l, want, "rank {r}, expert {e}");
        }
        // What MoeLayer::with_expert_map accepts: the local ids are exactly 0..n, the rest -1.
        let mut local: Vec<i32> = map.iter().copied().filter(|&l| l >= 0).collect();
        local.sort_unstable();
        assert_eq!(local, (0..32).collect::<Vec<_>>());
        assert_eq!(p.global_ids(r), &(r * 32..(r + 1) * 32).collect::<Vec<_>>()[..]);
    }
    assert_eq!(p.route(5, 17, 100), slot(3, 4));
}

#[test]
fn placement_errors_name_the_numbers() {
    let e = err(Placement::contiguous(10, 4));
    assert!(e.contains("E = 10") && e.contains("world = 4") && e.contains("10 % 4 = 2"), "{e}");
    assert!(err(Placement::contiguous(0, 4)).contains("E = 0"));
    assert!(err(Placement::contiguous(8, 0)).contains("world = 0"));
    // An explicit map: rank out of range.
    let e = err(Placement::from_map(2, &[vec![slot(0, 0)], vec![slot(2, 0)]]));
    assert!(e.contains("expert 1") && e.contains("rank 2") && e.contains("world = 2"), "{e}");
    // A duplicate local id.
    let e = err(Placement::from_map(2, &[vec![slot(0, 0)], vec![slot(0, 0)], vec![slot(1, 0)]]));
    assert!(
        e.contains("rank 0") && e.contains("local id 0") && e.contains("expert 0") && e.contains("expert 1"),
        "{e}"
    );
    // A gap in a rank's local ids.
    let e = err(Placement::from_map(2, &[vec![slot(0, 0)], vec![slot(0, 2)], vec![slot(1, 0)]]));
    assert!(e.contains("rank 0") && e.contains("local id 1") && e.contains("0..3"), "{e}");
    // A rank with no experts.
    let e = err(Placement::from_map(3, &[vec![slot(0, 0)], vec![slot(1, 0)]]));
    assert!(e.contains("rank 2") && e.contains("no experts"), "{e}");
    // An expert with no rank: the map does not cover 0..E.
    let e = err(Placement::from_map(2, &[vec![slot(0, 0)], vec![], vec![slot(1, 0)]]));
    assert!(e.contains("expert 1 of 3") && e.contains("0..3"), "{e}");
    // Two replicas of one expert on one rank.
    let e = err(Placement::from_map(2, &[vec![slot(0, 0), slot(0, 1)], vec![slot(1, 0)]]));
    assert!(e.contains("expert 0") && e.contains("rank 0"), "{e}");
    assert!(err(Placement::from_map(2, &[])).contains("0 experts"));
}

/// EPLB-style: 6 experts on 3 ranks, expert 0 (hot) replicated on every rank, expert 5 on ranks 1 and 2.
fn replicated() -> Placement {
    Placement::from_map(
        3,
        &[
            vec![slot(0, 0), slot(1, 0), slot(2, 0)],
            vec![slot(0, 1)],
            vec![slot(0, 2)],
            vec![slot(1, 1)],
            vec![slot(1, 2), slot(2, 2)],
            vec![slot(2, 1)],
        ],
    )
    .unwrap()
}

#[test]
fn replicas_route_deterministically() {
    let p = replicated();
    assert_eq!((p.local_experts(0), p.local_experts(1), p.local_experts(2)), (3, 3, 3));
    assert_eq!(p.expert_map(2), vec![0, -1, -1, -1, 2, 1]);
    assert_eq!(p.expert_map(1), vec![0, -1, -1, 1, 2, -1]);
    // (source + token) mod replicas.
    assert_eq!(p.route(0, 0, 0), slot(0, 0));
    assert_eq!(p.route(0, 1, 0), slot(1, 0));
    assert_eq!(p.route(2, 2, 0), slot(1, 0));
    assert_eq!(p.route(1, 0, 4), slot(2, 2));
    assert_eq!(p.route(1, 1, 4), slot(1, 2));
    assert_eq!(p.route(2, 7, 1), slot(0, 1));
}

#[test]
fn dispatch_plan_by_hand() {
    // 4 experts on 2 ranks (0, 1 | 2, 3), k = 2.
    let p = Placement::contiguous(4, 2).unwrap();
    let r0: &[i32] = &[2, 0, 1, 3, 3, 2]; // tokens: (2, 0) (1, 3) (3, 2)
    let r1: &[i32] = &[0, 1]; // one token
    let plan = DispatchPlan::new(&p, &[r0, r1], 2).unwrap();
    assert_eq!(plan.counts(), &[2, 4, 2, 0]);
    assert_eq!((plan.count(0, 1), plan.count(1, 0)), (4, 2));
    let s0 = plan.send(0);
    // To rank 0: slots 1 (t0 e0), 2 (t1 e1); to rank 1: 0 (t0 e2), 3 (t1 e3), 4 (t2 e3), 5 (t2 e2).
    assert_eq!(s0.send_order, vec![1, 2, 0, 3, 4, 5]);
    assert_eq!(s0.send_offsets, vec![0, 2, 6]);
    assert_eq!(
        s0.dest.iter().map(|d| (d.rank, d.local)).collect::<Vec<_>>(),
        [(0, 0), (0, 1), (1, 0), (1, 1), (1, 1), (1, 0)]
    );
    for (p, &flat) in s0.send_order.iter().enumerate() {
        assert_eq!(s0.slot_to_send[flat], p);
    }
    let rv0 = plan.recv(0);
    assert_eq!(rv0.offsets, vec![0, 2, 4]);
    let got: Vec<_> = rv0.rows.iter().map(|r| (r.source, r.token, r.slot, r.expert, r.local)).collect();
    assert_eq!(got, [(0, 0, 1, 0, 0), (0, 1, 0, 1, 1), (1, 0, 0, 0, 0), (1, 0, 1, 1, 1)]);
    let rv1 = plan.recv(1);
    assert_eq!(rv1.offsets, vec![0, 4, 4]);
    assert_eq!(rv1.rows.iter().map(|r| r.local).collect::<Vec<_>>(), [0, 1, 1, 0]);
}

#[test]
fn dispatch_errors_name_the_numbers() {
    let p = Placement::contiguous(4, 2).unwrap();
    let ok: &[i32] = &[0, 1];
    let e = err(DispatchPlan::new(&p, &[ok], 2));
    assert!(e.contains("1 ranks") && e.contains("world = 2"), "{e}");
    let e = err(DispatchPlan::new(&p, &[ok, &[0, 4]], 2));
    assert!(e.contains("rank 1, token 0, slot 1") && e.contains("expert id 4") && e.contains("0..4"), "{e}");
    let e = err(DispatchPlan::new(&p, &[ok, &[-1, 0]], 2));
    assert!(e.contains("expert id -1"), "{e}");
    let e = err(DispatchPlan::new(&p, &[ok, &[3, 3]], 2));
    assert!(e.contains("rank 1, token 0") && e.contains("expert 3 twice"), "{e}");
    let e = err(DispatchPlan::new(&p, &[ok, &[0, 1, 2]], 2));
    assert!(e.contains("rank 1") && e.contains("3 topk ids") && e.contains("top_k = 2"), "{e}");
    assert!(err(DispatchPlan::new(&p, &[ok, ok], 0)).contains("top_k = 0"));
    assert!(err(DispatchPlan::new(&p, &[ok, ok], 5)).contains("top_k = 5"));
}

const H: usize = 16;
const I: usize = 8;

fn experts(e: usize, format: ExpertFormat, bias: bool, rng: &mut Lcg) -> PackedExperts<bf16> {
    let r13 = if format.activation.gated() { 2 * I } else { I };
    let mut v = |n: usize, s: f32| -> Vec<bf16> { (0..n).map(|_| bf16::from_f32(rng.unit() * s)).collect() };
    let w13 = v(e * r13 * H, 0.5);
    let w2 = v(e * H * I, 0.5);
    let (b13, b2) = if bias {
        let f = |n: usize, rng: &mut Lcg| -> Vec<f32> { (0..n).map(|_| rng.unit() * 0.1).collect() };
        (Some(f(e * r13, rng)), Some(f(e * H, rng)))
    } else {
        (None, None)
    };
    PackedExperts::new(e, H, I, format, w13, w2, b13, b2).unwrap()
}

/// Routing of one rank: `tokens` tokens, each `k` distinct experts from `pick`.
fn routing(
    tokens: usize,
    k: usize,
    e: usize,
    rng: &mut Lcg,
    pick: &dyn Fn(&mut Lcg, usize) -> usize,
) -> (Vec<i32>, Vec<f32>) {
    let mut ids = Vec::new();
    let mut w = Vec::new();
    for _ in 0..tokens {
        let mut row: Vec<i32> = Vec::new();
        while row.len() < k {
            let id = pick(rng, e) as i32;
            if !row.contains(&id) {
                row.push(id);
            }
        }
        ids.extend(row);
        w.extend((0..k).map(|_| (rng.unit() + 1.5) / 2.5));
    }
    (ids, w)
}

type Pick = dyn Fn(&mut Lcg, usize) -> usize;

/// (name, placement, format, biases, tokens per rank, k, routing).
type Case<'a> = (&'a str, &'a Placement, ExpertFormat, bool, &'a [usize], usize, &'a Pick);

/// The EP step on every rank against the one-GPU reference of each rank's tokens.
fn check_ep(
    name: &str,
    placement: &Placement,
    format: ExpertFormat,
    bias: bool,
    tokens: &[usize],
    k: usize,
    pick: &Pick,
) {
    let mut rng = Lcg(0x5eed ^ tokens.iter().sum::<usize>() as u64 ^ (k as u64) << 8);
    let world = placement.world();
    let e = placement.experts();
    let p = experts(e, format, bias, &mut rng);
    let mut xs = Vec::new();
    let mut ids = Vec::new();
    let mut ws = Vec::new();
    for &t in tokens {
        xs.push((0..t * H).map(|_| bf16::from_f32(rng.unit())).collect::<Vec<_>>());
        let (i, w) = routing(t, k, e, &mut rng, pick);
        ids.push(i);
        ws.push(w);
    }
    let xr: Vec<&[bf16]> = xs.iter().map(Vec::as_slice).collect();
    let ir: Vec<&[i32]> = ids.iter().map(Vec::as_slice).collect();
    let wr: Vec<&[f32]> = ws.iter().map(Vec::as_slice).collect();
    let got = ep_forward_reference(placement, &p, &xr, &ir, &wr, k).unwrap();
    assert_eq!(got.len(), world);
    for s in 0..world {
        let want = moe_forward(&p, &xs[s], &ids[s], &ws[s], k);
        assert_eq!(got[s].len(), want.len(), "{name}: rank {s}");
        if bias {
            // One more rounding of (d2 + b2) per slot: within k half-steps of the largest slot value.
            let max = want.iter().map(|v| v.to_f32().abs()).fold(0.0f32, f32::max);
            for (i, (a, b)) in got[s].iter().zip(&want).enumerate() {
                let d = (a.to_f32() - b.to_f32()).abs();
                assert!(d <= (k as f32 + 1.0) * max.max(1.0) * 2f32.powi(-8), "{name}: rank {s}, elem {i}: {a} vs {b}");
            }
        } else {
            assert_eq!(got[s], want, "{name}: rank {s}: EP step differs from the one-GPU reference");
        }
    }
    // The receive bound the device buffers are sized for.
    let plan = DispatchPlan::new(placement, &ir, k).unwrap();
    let tmax = *tokens.iter().max().unwrap();
    for d in 0..world {
        assert!(plan.recv(d).rows.len() <= world * tmax * k.min(placement.local_experts(d)), "{name}: rank {d}");
    }
}

#[test]
fn ep_step_equals_one_gpu_reference() {
    let c = Placement::contiguous(8, 4).unwrap();
    let uniform: &Pick = &|rng, e| rng.below(e);
    // One hot expert (3, on rank 1) in every token, the rest uniform.
    let hot: &Pick = &|rng, e| if rng.below(4) != 0 { 3 } else { rng.below(e) };
    // Nothing routed to rank 3 (experts 6, 7).
    let no_rank3: &Pick = &|rng, _| rng.below(6);
    let cases: [Case; 9] = [
        ("uniform", &c, ExpertFormat::SWIGLU, false, &[9, 7, 12, 5], 2, uniform),
        ("uniform k = 3", &c, ExpertFormat::SWIGLU, false, &[6, 6, 6, 6], 3, uniform),
        ("skewed (hot expert on rank 1)", &c, ExpertFormat::SWIGLU, false, &[16, 11, 8, 13], 2, hot),
        ("empty rank 3", &c, ExpertFormat::SWIGLU, false, &[10, 4, 7, 9], 2, no_rank3),
        ("T = 1", &c, ExpertFormat::SWIGLU, false, &[1, 1, 1, 1], 2, uniform),
        ("T = 1 on one rank, 0 elsewhere", &c, ExpertFormat::SWIGLU, false, &[0, 1, 0, 0], 2, uniform),
        ("k = E / world spans ranks", &c, ExpertFormat::SWIGLU, false, &[5, 5, 5, 5], 8, uniform),
        ("gpt-oss storage with biases", &c, ExpertFormat::GPT_OSS, true, &[7, 3, 6, 2], 2, uniform),
        ("replicas", &replicated_8(), ExpertFormat::SWIGLU, false, &[12, 9, 10, 4], 3, hot),
    ];
    for (name, p, f, bias, t, k, pick) in cases {
        check_ep(name, p, f, bias, t, k, pick);
    }
}

/// 8 experts on 4 ranks with expert 3 (the hot one) on every rank and expert 0 on ranks 0 and 2.
fn replicated_8() -> Placement {
    let mut map: Vec<Vec<ExpertSlot>> = vec![Vec::new(); 8];
    let mut next = [0usize; 4];
    let mut put = |e: usize, r: usize, map: &mut Vec<Vec<ExpertSlot>>| {
        map[e].push(slot(r, next[r]));
        next[r] += 1;
    };
    for r in 0..4 {
        put(3, r, &mut map);
    }
    put(0, 0, &mut map);
    put(0, 2, &mut map);
    for (e, r) in [(1, 0), (2, 1), (4, 1), (5, 2), (6, 3), (7, 3)] {
        put(e, r, &mut map);
    }
    Placement::from_map(4, &map).unwrap()
}

#[test]
fn skewed_routing_lands_on_the_hot_rank() {
    let p = Placement::contiguous(8, 4).unwrap();
    // Every token of every rank picks expert 2 (rank 1) and expert 3 (rank 1).
    let ids: Vec<i32> = [2, 3].repeat(5);
    let plan = DispatchPlan::new(&p, &[&ids, &ids, &ids, &ids], 2).unwrap();
    for s in 0..4 {
        for d in 0..4 {
            assert_eq!(plan.count(s, d), if d == 1 { 10 } else { 0 });
        }
    }
    assert_eq!(plan.recv(1).rows.len(), 40);
    assert!(plan.recv(0).rows.is_empty() && plan.recv(0).offsets == vec![0; 5]);
}

fn dsv3_shape() -> LayerShape {
    LayerShape { experts: 256, global_experts: 256, top_k: 8, shared_groups: 0, hidden: 7168, inter: 2048, gated: true }
}

#[test]
fn ep_sizing_figures() {
    let p = Placement::contiguous(256, 8).unwrap();
    let s = EpSizing::new(dsv3_shape(), DType::BF16, WeightFormat::Dense, &p, 128, 132).unwrap();
    // world · T · min(k, E / world) = 8 · 128 · 8.
    assert_eq!(s.recv_rows, vec![8192; 8]);
    assert_eq!(s.row_bytes(), 7168 * 2);
    assert_eq!(s.send_rows(), 1024);
    assert_eq!(s.dispatch_bytes(), 1024 * (7168 * 2 + 4) + 8 * 4);
    assert_eq!(s.combine_bytes(), 1024 * 7168 * 2);
    assert_eq!(s.recv_buffer_bytes(0), 8192 * (2 * 7168 * 2 + 4));
    // The NCCL step's fixed blocks: 128 · min(8, 32) rows per peer, 8 peers, padding included.
    assert_eq!(s.block_rows(), 1024);
    assert_eq!(s.exchange_bytes(), (8192 * (7168 * 2 + 4), 8192 * 7168 * 2));
    // The local layer: 32 experts of 256, top-1 over the received rows, Grouped (expert map).
    let l = &s.local[0];
    assert_eq!((l.shape().experts, l.shape().global_experts, l.shape().top_k), (32, 256, 1));
    assert_eq!(l.needs().slots, 8192);
    assert_eq!(l.needs().layout_rows, 8192);
    assert_eq!(l.needs().tokens, 8192);
    // Fewer experts per rank than k: the bound is the rank's expert count.
    let p64 = Placement::contiguous(256, 64).unwrap();
    let s = EpSizing::new(dsv3_shape(), DType::BF16, WeightFormat::Fp8Block, &p64, 16, 132).unwrap();
    assert_eq!(s.recv_rows, vec![64 * 16 * 4; 64]);
    // An uneven explicit map: each rank's own bound.
    let map: Vec<Vec<ExpertSlot>> = (0..8).map(|e| vec![if e < 6 { slot(0, e) } else { slot(1, e - 6) }]).collect();
    let uneven = Placement::from_map(2, &map).unwrap();
    let shape =
        LayerShape { experts: 8, global_experts: 8, top_k: 4, shared_groups: 0, hidden: 64, inter: 32, gated: true };
    let s = EpSizing::new(shape, DType::BF16, WeightFormat::Dense, &uneven, 10, 132).unwrap();
    assert_eq!(s.recv_rows, vec![2 * 10 * 4, 2 * 10 * 2]);
    let e = err(EpSizing::new(shape, DType::BF16, WeightFormat::Dense, &p, 10, 132));
    assert!(e.contains("E = 8") && e.contains("256"), "{e}");
}

fn plan(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_moe-gemm")).arg("plan").args(args).output().unwrap()
}

#[test]
fn plan_ep_prints_the_figures() {
    let out = plan(&["--model", "deepseek-v3", "--max-tokens", "128", "--ep", "8"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(
        s.contains("expert parallel over 8 ranks (contiguous, 32 experts per rank, max_tokens 128 per rank"),
        "{s}"
    );
    assert!(s.contains("receive rows per rank: worst 8192"), "{s}");
    assert!(s.contains("1024 rows of 14336 B"), "{s}");
    // Without --ep the output is the single-device one, a prefix of the --ep output.
    let plain = plan(&["--model", "deepseek-v3", "--max-tokens", "128"]);
    let p = String::from_utf8(plain.stdout).unwrap();
    assert!(!p.contains("expert parallel") && s.starts_with(&p), "{p}");
}

#[test]
fn plan_ep_refuses_uneven_experts_before_any_output() {
    let out = plan(&["--model", "deepseek-v3,mixtral-8x7b", "--ep", "3"]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(e.contains("deepseek-v3 with --ep 3") && e.contains("E = 256") && e.contains("world = 3"), "{e}");
    let out = plan(&["--model", "mixtral-8x7b", "--ep", "0"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("world = 0"));
}

#[test]
fn dispatch_plan_invariants_on_random_routing() {
    let mut rng = Lcg(77);
    for (p, k) in
        [(Placement::contiguous(16, 4).unwrap(), 4), (replicated_8(), 3), (Placement::contiguous(6, 6).unwrap(), 2)]
    {
        let world = p.world();
        let e = p.experts();
        let ids: Vec<Vec<i32>> =
            (0..world).map(|s| routing(s * 3 + rng.below(9), k, e, &mut rng, &|r, e| r.below(e)).0).collect();
        let refs: Vec<&[i32]> = ids.iter().map(Vec::as_slice).collect();
        let plan = DispatchPlan::new(&p, &refs, k).unwrap();
        for (s, ids_s) in ids.iter().enumerate() {
            let sp = plan.send(s);
            assert_eq!(sp.tokens * k, ids_s.len());
            assert_eq!(*sp.send_offsets.last().unwrap(), ids_s.len());
            for d in 0..world {
                let block = &sp.send_order[sp.send_offsets[d]..sp.send_offsets[d + 1]];
                assert_eq!(block.len(), plan.count(s, d));
                // Stable: (token, slot) order within a destination.
                assert!(block.windows(2).all(|w| w[0] < w[1]), "source {s}, dest {d}: {block:?}");
                for (i, &flat) in block.iter().enumerate() {
                    let pos = sp.send_offsets[d] + i;
                    assert_eq!(sp.slot_to_send[flat], pos);
                    let want = p.route(s, flat / k, ids_s[flat] as usize);
                    assert_eq!(sp.dest[pos], want);
                    // The receiver sees the same row at its source block's i-th place.
                    let r = plan.recv(d).rows[plan.recv(d).offsets[s] + i];
                    assert_eq!((r.source, r.token, r.slot, r.local), (s, flat / k, flat % k, want.local));
                    assert_eq!(p.global_ids(d)[r.local], r.expert);
                }
            }
        }
        for d in 0..world {
            let rv = plan.recv(d);
            let total: usize = (0..world).map(|s| plan.count(s, d)).sum();
            assert_eq!(rv.rows.len(), total);
            assert!((0..world).all(|s| rv.offsets[s + 1] - rv.offsets[s] == plan.count(s, d)));
        }
    }
}
