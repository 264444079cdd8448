//! A point of `bench --layer` (a model, T and routing, with Auto's picks, the floor's terms and the read floor) and
//! one timed entry at it.

use moe_gemm::ceilings::Ceilings;
use moe_gemm::kernels::fused::FusedTile;
use moe_gemm::Backend;

use super::super::layer_fp8::{floor_terms, LayerDtype};

/// One timed entry.
pub(super) struct Timed {
    /// Index into the points.
    pub(super) point: usize,
    /// The backend asked for.
    pub(super) asked: Backend,
    /// The backend that ran.
    pub(super) ran: Backend,
    /// (median, p10, p90) µs, or not timed.
    pub(super) times: Option<(f64, f64, f64)>,
    pub(super) dtype: LayerDtype,
    /// The Fused tile of this row, where the run times Fused over several (`--fused-tile a,b`).
    pub(super) tile: Option<FusedTile>,
}

impl Timed {
    /// The backend asked for, with the Fused tile where the run times several (`Fused/decode-16`).
    pub(super) fn label(&self) -> String {
        match self.tile {
            Some(t) => format!("{:?}/{}", self.asked, t.name().trim_start_matches("fused-")),
            None => format!("{:?}", self.asked),
        }
    }
}

pub(super) struct Point {
    pub(super) model: &'static str,
    pub(super) experts: usize,
    pub(super) top_k: usize,
    pub(super) hidden: usize,
    pub(super) inter: usize,
    pub(super) tokens: usize,
    pub(super) ids: Vec<i32>,
    pub(super) weights: Vec<f32>,
    /// The backend `Auto` picks here (bf16 layer).
    pub(super) auto: Backend,
    /// The backend `Auto` picks over the quantised (FP8 or MXFP4) experts here, where that layer runs.
    pub(super) auto_fp8: Option<Backend>,
    pub(super) routing: &'static str,
    /// Expert-parallel degree: this GPU holds the experts `e` with `e % ep == 0` (1: all).
    pub(super) ep: usize,
    /// With `--read-floor`: per dtype timed here, the median µs of one streaming read of its active weight bytes.
    pub(super) read_us: Vec<(LayerDtype, f64)>,
}

impl Point {
    pub(super) fn name(&self) -> String {
        if self.routing == "uniform" {
            format!("{}/T={}", self.model, self.tokens)
        } else {
            format!("{}/T={}/{}", self.model, self.tokens, self.routing)
        }
    }
    /// max(active experts' weight bytes / read bandwidth, useful FLOPs / dense rate), as PERF_TARGETS.md
    /// defines it, with the ceilings measured in this run.
    pub(super) fn floor_us(&self, c: &Ceilings) -> f64 {
        self.floor_for(LayerDtype::Bf16, c)
    }
    /// The floor of the layer over `dtype` experts: bytes and FLOPs of [`floor_terms`], at the dense rate of
    /// `dtype` (bf16 or fp8).
    pub(super) fn floor_for(&self, dtype: LayerDtype, c: &Ceilings) -> f64 {
        let (bytes, flops) = self.terms(dtype);
        match dtype {
            LayerDtype::Bf16 => c.floor_us(bytes, flops),
            // Hopper has no FP4 MMA: the fp8 rate is the best its tensor cores give MXFP8 x e2m1.
            LayerDtype::Fp8 | LayerDtype::Mxfp4 | LayerDtype::Fp8Channel => c.floor_fp8_us(bytes, flops),
        }
    }
    /// [`floor_terms`] of this GPU's active experts and rows over `dtype` experts: (bytes, FLOPs).
    pub(super) fn terms(&self, dtype: LayerDtype) -> (f64, f64) {
        let mut active = vec![false; self.experts];
        let local = self.ids.iter().filter(|&&e| e as usize % self.ep == 0);
        local.clone().for_each(|&e| active[e as usize] = true);
        let n = active.iter().filter(|&&a| a).count();
        floor_terms(dtype, n, local.count(), self.hidden, self.inter)
    }
    /// The `--read-floor` median of `dtype`'s active weight bytes at this point, where timed.
    pub(super) fn read_for(&self, dtype: LayerDtype) -> Option<f64> {
        self.read_us.iter().find(|r| r.0 == dtype).map(|r| r.1)
    }
    /// The point's Auto pick for `dtype`'s layer.
    pub(super) fn auto_for(&self, dtype: LayerDtype) -> Option<Backend> {
        match dtype {
            LayerDtype::Bf16 => Some(self.auto),
            LayerDtype::Fp8 | LayerDtype::Mxfp4 | LayerDtype::Fp8Channel => self.auto_fp8,
        }
    }
}

/// The bf16 layer's Auto median at point `pi` (the row whose backend ran is Auto's pick), where timed.
pub(super) fn bf16_auto_us(results: &[Timed], pi: usize, p: &Point) -> Option<f64> {
    results
        .iter()
        .find(|r| {
            r.point == pi && r.dtype == LayerDtype::Bf16 && r.ran == p.auto && r.tile.is_none() && r.times.is_some()
        })
        .and_then(|r| r.times)
        .map(|t| t.0)
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::super::layer_inputs::routing;
    use super::*;

    /// A point of `ids` (k per token) over `experts`, Grouped for both dtypes, uniform routing.
    pub(in super::super) fn point(
        ids: Vec<i32>,
        experts: usize,
        k: usize,
        hidden: usize,
        inter: usize,
        ep: usize,
    ) -> Point {
        let tokens = ids.len() / k;
        Point {
            model: "test",
            experts,
            top_k: k,
            hidden,
            inter,
            tokens,
            weights: vec![1.0 / k as f32; ids.len()],
            ids,
            auto: Backend::Grouped,
            auto_fp8: Some(Backend::Grouped),
            routing: "uniform",
            ep,
            read_us: Vec::new(),
        }
    }

    #[test]
    fn fp8_floors_use_the_fp8_bytes_and_rate() {
        let c = Ceilings { read_bytes_per_s: 4.46e12, bf16_flops: Some(792e12), fp8_flops: Some(1493e12) };
        // Decode: one token over 8 of 256 experts, bytes-bound: the fp8 floor is the bytes ratio (~0.5) of bf16's.
        let ids: Vec<i32> = (0..8).map(|j| j * 32).collect();
        let p = point(ids, 256, 8, 7168, 2048, 1);
        let (b16, _) = floor_terms(LayerDtype::Bf16, 8, 8, 7168, 2048);
        let (b8, _) = floor_terms(LayerDtype::Fp8, 8, 8, 7168, 2048);
        assert!((p.floor_us(&c) - b16 / 4.46e12 * 1e6).abs() < 1e-9);
        assert!((p.floor_for(LayerDtype::Fp8, &c) - b8 / 4.46e12 * 1e6).abs() < 1e-9);
        let r = p.floor_for(LayerDtype::Fp8, &c) / p.floor_us(&c);
        assert!((0.5..0.501).contains(&r), "{r}");
        // Prefill: 16384 tokens x 8 slots over every expert, FLOPs-bound: the fp8 floor is FLOPs / fp8 rate.
        let (ids, _) = routing("balanced", 256, 8, 16384, 1).unwrap();
        let p = point(ids, 256, 8, 7168, 2048, 1);
        let flops = 2.0 * 3.0 * (16384usize * 8 * 7168 * 2048) as f64;
        assert!((p.floor_for(LayerDtype::Fp8, &c) - flops / 1493e12 * 1e6).abs() < 1e-6);
        assert!((p.floor_us(&c) - flops / 792e12 * 1e6).abs() < 1e-6);
        // Without a measured fp8 rate, the bytes term alone.
        let no_rate = Ceilings { fp8_flops: None, ..c };
        let (b8, _) = floor_terms(LayerDtype::Fp8, 256, 16384 * 8, 7168, 2048);
        assert!((p.floor_for(LayerDtype::Fp8, &no_rate) - b8 / 4.46e12 * 1e6).abs() < 1e-6);
    }

    #[test]
    fn fp8_floors_count_this_gpus_experts_under_expert_parallelism() {
        let c = Ceilings { read_bytes_per_s: 4e12, bf16_flops: None, fp8_flops: None };
        // ep 2: experts 0 and 2 are local, 1 and 3 remote.
        let p = point(vec![0, 1, 2, 3], 4, 2, 256, 128, 2);
        let (b8, _) = floor_terms(LayerDtype::Fp8, 2, 2, 256, 128);
        assert!((p.floor_for(LayerDtype::Fp8, &c) - b8 / 4e12 * 1e6).abs() < 1e-12);
    }
}
