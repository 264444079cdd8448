//! CPU reference of [`ExpertLayout::build`](crate::layouts::ExpertLayout::build): a plain loop in token order, written
//! from the layout contracts (module docs of `layouts`) rather than from the kernel.

use crate::layouts::{LayoutDims, LayoutSpec};

/// Every array a layout build produces, for `tokens` tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutRef {
    pub counts: Vec<i32>,
    pub offsets: Vec<i32>,
    /// `[capacity]`, `tokens·k` on padding.
    pub sorted_ids: Vec<i32>,
    /// `[capacity / block_m]`: the expert owning each tile (each position for block_m 1), −1 past the last.
    pub expert_ids: Vec<i32>,
    /// `[capacity]`, −1 on padding.
    pub m_indices: Vec<i32>,
    /// `[tokens·k]`, −1 if dropped.
    pub positions: Vec<i32>,
    pub total: i32,
    /// Whether the build must report an invalid id.
    pub bad_id: bool,
    /// Whether the build must report a masked-capacity overflow.
    pub overflow: bool,
}

pub fn build(dims: &LayoutDims, tokens: usize, topk_ids: &[i32], expert_map: Option<&[i32]>) -> LayoutRef {
    let rows = tokens * dims.top_k;
    let cap = dims.capacity();
    let le_count = dims.local_experts;
    let mut bad_id = false;
    // The local expert of every row, in token order.
    let local: Vec<Option<usize>> = topk_ids[..rows]
        .iter()
        .map(|&e| {
            if e < 0 || e as usize >= dims.experts {
                bad_id = true;
                return None;
            }
            match expert_map {
                None => Some(e as usize),
                Some(m) => match m[e as usize] {
                    -1 => None,
                    l if l < -1 || l as usize >= le_count => {
                        bad_id = true;
                        None
                    }
                    l => Some(l as usize),
                },
            }
        })
        .collect();
    let mut rows_of: Vec<Vec<usize>> = vec![Vec::new(); le_count];
    for (r, l) in local.iter().enumerate() {
        if let Some(l) = l {
            rows_of[*l].push(r);
        }
    }
    let mut out = LayoutRef {
        counts: vec![0; le_count],
        offsets: vec![0; le_count + 1],
        sorted_ids: vec![rows as i32; cap],
        expert_ids: vec![-1; cap / dims.block_m()],
        m_indices: vec![-1; cap],
        positions: vec![-1; rows],
        total: 0,
        bad_id,
        overflow: false,
    };
    let mut at = 0usize;
    for (e, list) in rows_of.iter().enumerate() {
        out.offsets[e] = at as i32;
        let room = match dims.spec {
            LayoutSpec::Masked { max_m } => {
                out.overflow |= list.len() > max_m;
                max_m
            }
            LayoutSpec::Grouped => list.len(),
            LayoutSpec::Aligned { block_m } => list.len().div_ceil(block_m) * block_m,
        };
        let kept = list.len().min(room);
        out.counts[e] = if matches!(dims.spec, LayoutSpec::Masked { .. }) { kept as i32 } else { list.len() as i32 };
        for (i, &r) in list.iter().take(kept).enumerate() {
            out.sorted_ids[at + i] = r as i32;
            out.m_indices[at + i] = e as i32;
            out.positions[r] = (at + i) as i32;
        }
        for tile in at / dims.block_m()..(at + room) / dims.block_m() {
            out.expert_ids[tile] = e as i32;
        }
        at += room;
    }
    out.offsets[le_count] = at as i32;
    out.total = at as i32;
    out
}
