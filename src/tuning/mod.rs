//! Tuned-config files in vLLM's fused-MoE format, read and written.
//!
//! vLLM names a tuned config `E=<E>,N=<N>,device_name=<GPU>[,dtype=<d>][,block_shape=[<n>, <k>]].json`, where `N`
//! is the intermediate size per tensor-parallel shard and `<GPU>` is `torch.cuda.get_device_name()` with spaces
//! replaced by `_`; the file maps token counts (`"1"`, `"2"`, …) to a kernel configuration. `moe-gemm` reads such
//! files to derive the shapes and batch sizes to benchmark, and writes its own choices (tile, schedule, cluster
//! and backend per token bucket) under the same name format, so the two can be diffed bucket by bucket.
//!
//! [`ConfigName`] is part of the library; the JSON files themselves (`ConfigFile`, `LayerChoice`) are the
//! binary's, behind the default `cli` feature (they need `serde_json`).

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use crate::backend::{Backend, Backends, WeightFormat};
use crate::error::{Error, Result};
use crate::kernels::fused::FusedTile;

/// The parsed name of a tuned-config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigName {
    pub experts: usize,
    /// Intermediate size per shard (vLLM's `N`).
    pub n: usize,
    pub device_name: String,
    pub dtype: Option<String>,
    pub block_shape: Option<[usize; 2]>,
}

fn bad(name: &str, why: &str) -> Error {
    Error::InvalidProblem(format!(
        "config file name {name:?}: {why} (expected E=<E>,N=<N>,device_name=<GPU>[,dtype=<d>][,block_shape=[<n>, <k>]].json)"
    ))
}

impl ConfigName {
    /// The device name as vLLM writes it: spaces become underscores.
    pub fn device(name: &str) -> String {
        name.replace(' ', "_")
    }

    /// Parses a file name (a path's last component is taken).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming what is missing or malformed.
    pub fn parse(path: &str) -> Result<ConfigName> {
        let file = Path::new(path).file_name().and_then(|f| f.to_str()).unwrap_or(path);
        let stem = file.strip_suffix(".json").ok_or_else(|| bad(file, "no .json suffix"))?;
        // block_shape holds a comma: take it off the end first.
        let (head, block_shape) = match stem.find(",block_shape=") {
            Some(i) => {
                let v = &stem[i + ",block_shape=".len()..];
                let inner = v
                    .strip_prefix('[')
                    .and_then(|v| v.strip_suffix(']'))
                    .ok_or_else(|| bad(file, "block_shape is not [n, k]"))?;
                let dims: Vec<usize> = inner
                    .split(',')
                    .map(|d| d.trim().parse().map_err(|_| bad(file, "block_shape is not [n, k]")))
                    .collect::<Result<_>>()?;
                let [bn, bk] = dims[..] else { return Err(bad(file, "block_shape needs two sizes")) };
                (&stem[..i], Some([bn, bk]))
            }
            None => (stem, None),
        };
        let mut fields: BTreeMap<&str, &str> = BTreeMap::new();
        for part in head.split(',') {
            let (k, v) = part.split_once('=').ok_or_else(|| bad(file, &format!("field {part:?} has no '='")))?;
            fields.insert(k, v);
        }
        let num = |k: &str| -> Result<usize> {
            fields
                .get(k)
                .ok_or_else(|| bad(file, &format!("no {k}=")))?
                .parse()
                .map_err(|_| bad(file, &format!("{k} is not a number")))
        };
        let name = ConfigName {
            experts: num("E")?,
            n: num("N")?,
            device_name: fields.get("device_name").ok_or_else(|| bad(file, "no device_name="))?.to_string(),
            dtype: fields.get("dtype").map(|d| d.to_string()),
            block_shape,
        };
        if let Some(k) = fields.keys().find(|k| !matches!(**k, "E" | "N" | "device_name" | "dtype")) {
            return Err(bad(file, &format!("unknown field {k:?}")));
        }
        Ok(name)
    }
}

impl ConfigName {
    /// The name of this crate's table for layers of `experts` experts of intermediate size `inter` over weights
    /// of `format` on the GPU named `device_name`, as vLLM names its configs of the same kernels: `dtype=bf16`
    /// for 16-bit experts, `dtype=fp8_w8a8,block_shape=[128, 128]` for block-FP8 ones.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a format no table is tuned for ([`table_format`]).
    pub fn for_table(device_name: &str, format: WeightFormat, experts: usize, inter: usize) -> Result<ConfigName> {
        let (dtype, block_shape) = match format {
            WeightFormat::Dense => ("bf16", None),
            WeightFormat::Fp8Block => ("fp8_w8a8", Some([128, 128])),
            f => return Err(untunable(f)),
        };
        Ok(ConfigName {
            experts,
            n: inter,
            device_name: ConfigName::device(device_name),
            dtype: Some(dtype.into()),
            block_shape,
        })
    }
}

fn untunable(f: WeightFormat) -> Error {
    Error::InvalidProblem(format!(
        "tuned backends over {f} experts: tables are tuned for dense (bf16/f16) and fp8 block 128x128 experts only \
         (their Auto picks Grouped)"
    ))
}

/// The weight format a table of this name was measured over: `dtype` absent (vLLM's bf16 files), `bf16`,
/// `float16` or `fp16`: [`WeightFormat::Dense`]; `fp8_w8a8` with `block_shape=[128, 128]`:
/// [`WeightFormat::Fp8Block`].
///
/// # Errors
/// [`Error::InvalidProblem`] naming the name's dtype and block shape, for any other (per-tensor or per-channel
/// FP8, int8, other blocks: formats whose Auto has one backend).
pub fn table_format(name: &ConfigName) -> Result<WeightFormat> {
    match (name.dtype.as_deref(), name.block_shape) {
        (None | Some("bf16" | "float16" | "fp16"), None) => Ok(WeightFormat::Dense),
        (Some("fp8_w8a8"), Some([128, 128])) => Ok(WeightFormat::Fp8Block),
        (d, b) => Err(Error::InvalidProblem(format!(
            "{name}: dtype {d:?} with block_shape {b:?}: tables are read for bf16 (dtype absent, bf16, float16 or \
             fp16, no block_shape) and block FP8 (dtype=fp8_w8a8, block_shape=[128, 128])"
        ))),
    }
}

impl fmt::Display for ConfigName {
    /// The file name, as vLLM formats it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "E={},N={},device_name={}", self.experts, self.n, self.device_name)?;
        if let Some(d) = &self.dtype {
            write!(f, ",dtype={d}")?;
        }
        if let Some([n, k]) = self.block_shape {
            write!(f, ",block_shape=[{n}, {k}]")?;
        }
        f.write_str(".json")
    }
}

/// A tuned-config file: its name and, per token count, the configuration object.
#[cfg(feature = "cli")]
#[doc(hidden)]
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigFile {
    pub name: ConfigName,
    pub buckets: BTreeMap<usize, serde_json::Value>,
}

#[cfg(feature = "cli")]
impl ConfigFile {
    /// Reads a vLLM-format file.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for an unreadable file, a malformed name, or keys that are not token counts.
    pub fn read(path: &Path) -> Result<ConfigFile> {
        let name = ConfigName::parse(&path.to_string_lossy())?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidProblem(format!("cannot read {}: {e}", path.display())))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::InvalidProblem(format!("{}: not JSON: {e}", path.display())))?;
        let obj =
            v.as_object().ok_or_else(|| Error::InvalidProblem(format!("{}: not a JSON object", path.display())))?;
        let mut buckets = BTreeMap::new();
        for (k, cfg) in obj {
            let t: usize = k
                .parse()
                .map_err(|_| Error::InvalidProblem(format!("{}: key {k:?} is not a token count", path.display())))?;
            buckets.insert(t, cfg.clone());
        }
        Ok(ConfigFile { name, buckets })
    }

    /// Writes the file as `dir/<name>`, keys in increasing token count (as vLLM's files are).
    pub fn write(&self, dir: &Path) -> Result<std::path::PathBuf> {
        let path = dir.join(self.name.to_string());
        let mut obj = serde_json::Map::new();
        for (t, cfg) in &self.buckets {
            obj.insert(t.to_string(), cfg.clone());
        }
        let text = serde_json::to_string_pretty(&serde_json::Value::Object(obj)).expect("JSON of JSON values");
        std::fs::write(&path, text + "\n")
            .map_err(|e| Error::InvalidProblem(format!("cannot write {}: {e}", path.display())))?;
        Ok(path)
    }

    /// The token counts both files tune, with each side's configuration: for diffing.
    pub fn common_buckets<'a>(
        &'a self,
        other: &'a ConfigFile,
    ) -> Vec<(usize, &'a serde_json::Value, &'a serde_json::Value)> {
        self.buckets.iter().filter_map(|(t, a)| other.buckets.get(t).map(|b| (*t, a, b))).collect()
    }
}

/// What a layer runs for one token bucket, as one entry of a config file written by `moe-gemm bench --layer
/// --write-configs`: the backend (the fastest measured; [`TunedBackends`] reads it back), Auto's cost-model
/// pick beside it, and, per GEMM (`w13`, `w2`), the kernel configuration it launches. `Batched`
/// runs the two decode kernels (no tile); the layout backends the grouped GEMM's heuristic tile; `Fused` its
/// fused tile (`fused_tile`, or the per-batch choice). Where the run fixed or measured the Fused tile, the
/// entry names it (`"fused_tile"`, whichever backend won) and a layer's Fused passes at that bucket take it.
#[cfg(feature = "cli")]
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct LayerChoice {
    /// The backend the bucket runs: the fastest measured.
    pub backend: Backend,
    /// What the built-in cost model picks there (for comparison).
    pub auto: Backend,
    /// The weights' format: over block FP8 the GEMMs are the FP8 blockwise ones, the Fused tile its FP8 kernel's.
    pub format: WeightFormat,
    pub experts: usize,
    pub hidden: usize,
    pub inter: usize,
    pub top_k: usize,
    pub tokens: usize,
    pub sm_count: usize,
    /// The Fused tile of the bucket (fixed by the run, or measured best); `None`: the per-batch rule.
    pub fused_tile: Option<FusedTile>,
    pub median_us: Option<f64>,
}

#[cfg(feature = "cli")]
impl LayerChoice {
    pub fn entry(&self) -> serde_json::Value {
        let rows = self.tokens * self.top_k;
        let gemm = |n: usize| match self.backend {
            Backend::Batched => serde_json::json!({"config": "batched-decode", "schedule": "Streaming"}),
            Backend::Fused => {
                let t = self.fused_tile.unwrap_or_else(|| {
                    if self.format == WeightFormat::Fp8Block {
                        FusedTile::for_rows_fp8(rows, self.experts)
                    } else {
                        FusedTile::for_rows(rows, self.experts)
                    }
                });
                let (tm, tn, tk) = t.tile();
                let schedule = if t.has_fp8() { "FusedPersistent" } else { "SwapAbStreaming" };
                serde_json::json!({"config": t.name(), "schedule": schedule, "tile": [tm, tn, tk], "cluster": [1, 1, 1]})
            }
            _ if self.format == WeightFormat::Fp8Block => {
                let c = crate::kernels::fp8_blockwise::sm90::Fp8TileConfig::heuristic(self.experts, rows);
                serde_json::json!({"config": c.name(), "schedule": format!("{:?}", c.schedule())})
            }
            _ => {
                let c = crate::kernels::TileConfig::heuristic(self.experts, n, rows, self.sm_count);
                let (tm, tn, tk) = c.tile();
                let (cm, cn) = c.cluster();
                serde_json::json!({"config": c.name(), "schedule": format!("{:?}", c.schedule()), "tile": [tm, tn, tk], "cluster": [cm, cn, 1]})
            }
        };
        let mut entry = serde_json::json!({
            "backend": format!("{:?}", self.backend),
            "auto_pick": format!("{:?}", self.auto),
            "w13": gemm(2 * self.inter),
            "w2": gemm(self.hidden),
            "median_us": self.median_us,
        });
        if let Some(t) = self.fused_tile {
            entry["fused_tile"] = serde_json::json!(t.name());
        }
        entry
    }
}

/// `Auto`'s choice per token bucket, measured on a GPU rather than modelled: read from a tuned-config file that
/// `moe-gemm bench --layer --write-configs` wrote (each bucket's `"backend"`, the fastest backend measured at
/// that batch), and given to a layer with [`MoeLayerOptions::tuned`](crate::MoeLayerOptions::tuned). A batch
/// takes the bucket nearest its token count (vLLM's rule: `min(keys, key = |key - M|)`, the smaller key on a
/// tie). Where the bucket's backend cannot run the batch (Batched past its 4096 rows, a backend the weights'
/// format has no kernels for, any backend under expert parallelism but Grouped), the layer falls back to its
/// cost model, as vLLM falls back to its default rule.
///
/// A bucket may also name the `Fused` backend's tile measured best there (`"fused_tile"`, written by `moe-gemm
/// tune`): a Fused pass of a 16-bit layer takes the tile of the bucket nearest its token count, unless the
/// layer fixes one ([`MoeLayer::set_fused_tile`](crate::MoeLayer::set_fused_tile)); buckets without one, and
/// tables written before tiles were tuned, leave the choice to [`FusedTile::for_rows`].
///
/// A fixed array (at most [`TunedBackends::MAX_BUCKETS`] buckets), so that the options holding it stay `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TunedBackends {
    /// The weights it was measured over: a table applies to layers of this format only.
    format: WeightFormat,
    /// The shipped file it came from ([`TunedBackends::shipped`]); `None`: given by the caller.
    shipped: Option<&'static str>,
    experts: usize,
    inter: usize,
    len: usize,
    buckets: [(usize, Backend); TunedBackends::MAX_BUCKETS],
    /// The Fused tile of each bucket (same order), where one was measured.
    tiles: [Option<FusedTile>; TunedBackends::MAX_BUCKETS],
}

impl TunedBackends {
    /// Most buckets a table holds (vLLM's files have 18).
    pub const MAX_BUCKETS: usize = 32;

    /// A table for layers of `experts` experts of intermediate size `inter` (vLLM's `E` and `N`) over 16-bit dense
    /// weights ([`Self::with_format`] for block-FP8 ones).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the constraint: no bucket, more than [`Self::MAX_BUCKETS`], a token count
    /// of 0 or given twice, `Auto` as a bucket's backend.
    pub fn new(experts: usize, inter: usize, buckets: &[(usize, Backend)]) -> Result<TunedBackends> {
        let bad = |s: String| Err(Error::InvalidProblem(format!("tuned backends: {s}")));
        if buckets.is_empty() || buckets.len() > Self::MAX_BUCKETS {
            return bad(format!("{} buckets: between 1 and {} are taken", buckets.len(), Self::MAX_BUCKETS));
        }
        let mut sorted = buckets.to_vec();
        sorted.sort_by_key(|b| b.0);
        if let Some(w) = sorted.windows(2).find(|w| w[0].0 == w[1].0) {
            return bad(format!("token count {} given twice", w[0].0));
        }
        if sorted[0].0 == 0 {
            return bad("token count 0: buckets are batch sizes of at least 1".into());
        }
        if let Some(b) = sorted.iter().find(|b| b.1 == Backend::Auto) {
            return bad(format!("bucket {}: Auto is not a backend a batch runs", b.0));
        }
        let mut table = [(0, Backend::Grouped); Self::MAX_BUCKETS];
        table[..sorted.len()].copy_from_slice(&sorted);
        Ok(TunedBackends {
            format: WeightFormat::Dense,
            shipped: None,
            experts,
            inter,
            len: sorted.len(),
            buckets: table,
            tiles: [None; Self::MAX_BUCKETS],
        })
    }

    /// The table as measured over weights of `format` (a layer over other weights refuses it).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a format no table is tuned for, or a bucket whose backend has no kernels
    /// over `format` (Eager over block FP8), each named.
    pub fn with_format(mut self, format: WeightFormat) -> Result<TunedBackends> {
        if !matches!(format, WeightFormat::Dense | WeightFormat::Fp8Block) {
            return Err(untunable(format));
        }
        if let Some(b) = self.buckets().iter().find(|b| !format.backends().contains(b.1)) {
            return Err(Error::InvalidProblem(format!(
                "tuned backends: bucket {}: {} does not run over {format} experts",
                b.0,
                b.1.name()
            )));
        }
        self.format = format;
        Ok(self)
    }

    /// The weights the table was measured over.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// The shipped file the table came from ([`Self::shipped`]); `None` for a table the caller made or read.
    pub fn shipped_file(&self) -> Option<&'static str> {
        self.shipped
    }

    /// The table with the Fused tile of some of its buckets: `(token count, tile)`, for 16-bit experts.
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] for a token count that is not a bucket of the table.
    pub fn with_fused_tiles(mut self, tiles: &[(usize, FusedTile)]) -> Result<TunedBackends> {
        for &(t, tile) in tiles {
            let i = self.buckets().iter().position(|b| b.0 == t).ok_or_else(|| {
                Error::InvalidProblem(format!("tuned backends: Fused tile for token count {t}, which is no bucket"))
            })?;
            self.tiles[i] = Some(tile);
        }
        Ok(self)
    }

    /// Parses a file's text: a JSON object from token counts to entries holding a `"backend"` name (as
    /// `bench --layer --write-configs` writes them; other fields are ignored). The name's dtype and block shape
    /// give the weight format ([`table_format`]).
    ///
    /// # Errors
    /// [`Error::InvalidProblem`] naming the key or value that does not parse; as [`Self::new`],
    /// [`table_format`] and [`Self::with_format`].
    pub fn from_json(name: &ConfigName, text: &str) -> Result<TunedBackends> {
        let format = table_format(name)?;
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::InvalidProblem(format!("{name}: not JSON: {e}")))?;
        let obj = v.as_object().ok_or_else(|| Error::InvalidProblem(format!("{name}: not a JSON object")))?;
        let mut buckets = Vec::with_capacity(obj.len());
        let mut tiles = Vec::new();
        for (k, entry) in obj {
            let t: usize =
                k.parse().map_err(|_| Error::InvalidProblem(format!("{name}: key {k:?} is not a token count")))?;
            if let Some(tile) = entry.get("fused_tile") {
                let tile = tile.as_str().and_then(FusedTile::by_name).ok_or_else(|| {
                    let names: Vec<&str> = FusedTile::ALL.iter().map(|t| t.name()).collect();
                    Error::InvalidProblem(format!(
                        "{name}: bucket {k}: \"fused_tile\" {tile} is not a tile ({})",
                        names.join(", ")
                    ))
                })?;
                tiles.push((t, tile));
            }
            let b = entry.get("backend").and_then(|b| b.as_str()).ok_or_else(|| {
                Error::InvalidProblem(format!(
                    "{name}: bucket {k} has no \"backend\" (a vLLM kernel config, not one this crate wrote?)"
                ))
            })?;
            buckets.push((t, parse_backend(b).map_err(|e| Error::InvalidProblem(format!("{name}: bucket {k}: {e}")))?));
        }
        let table = TunedBackends::new(name.experts, name.n, &buckets).and_then(|t| t.with_format(format));
        table.and_then(|t| t.with_fused_tiles(&tiles)).map_err(|e| match e {
            Error::InvalidProblem(m) => Error::InvalidProblem(format!("{name}: {m}")),
            e => e,
        })
    }

    /// Reads a file named as vLLM names them (`E=..,N=..,device_name=...json`).
    ///
    /// # Errors
    /// As [`ConfigName::parse`] and [`Self::from_json`]; an unreadable file.
    pub fn read(path: &Path) -> Result<TunedBackends> {
        let name = ConfigName::parse(&path.to_string_lossy())?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::InvalidProblem(format!("cannot read {}: {e}", path.display())))?;
        TunedBackends::from_json(&name, &text)
    }

    /// `E` and `N` of the layers it was tuned for.
    pub fn shape(&self) -> (usize, usize) {
        (self.experts, self.inter)
    }
    /// The buckets, in increasing token count.
    pub fn buckets(&self) -> &[(usize, Backend)] {
        &self.buckets[..self.len]
    }

    /// The table without the buckets whose backend is not in `set` (`None` if none is left): a plan whose
    /// backends the caller chose keeps the shipped table's measurements for those backends only.
    pub fn restricted_to(&self, set: Backends) -> Option<TunedBackends> {
        let kept: Vec<_> = self.buckets().iter().copied().filter(|b| set.contains(b.1)).collect();
        let tiles: Vec<_> = (0..self.len)
            .filter(|&i| set.contains(self.buckets[i].1))
            .filter_map(|i| self.tiles[i].map(|t| (self.buckets[i].0, t)))
            .collect();
        (!kept.is_empty()).then(|| {
            let t = TunedBackends::new(self.experts, self.inter, &kept)
                .and_then(|t| t.with_format(self.format))
                .and_then(|t| t.with_fused_tiles(&tiles))
                .expect("a subset of a table");
            TunedBackends { shipped: self.shipped, ..t }
        })
    }

    /// The backend of the bucket nearest `tokens` (the smaller bucket on a tie).
    pub fn pick(&self, tokens: usize) -> Backend {
        self.buckets[self.nearest(tokens)].1
    }

    /// The Fused tile of the bucket nearest `tokens`, if that bucket names one.
    pub fn fused_tile(&self, tokens: usize) -> Option<FusedTile> {
        self.tiles[self.nearest(tokens)]
    }

    /// The index of the bucket nearest `tokens` (the smaller bucket on a tie).
    fn nearest(&self, tokens: usize) -> usize {
        (0..self.len).min_by_key(|&i| self.buckets[i].0.abs_diff(tokens)).expect("at least one bucket")
    }
}

/// A backend by name, as the CLI and the config files write it (`batched`, `Grouped`, ...: any case).
fn parse_backend(name: &str) -> Result<Backend> {
    Backend::CONCRETE
        .into_iter()
        .chain([Backend::Auto])
        .find(|b| b.name().eq_ignore_ascii_case(name))
        .ok_or_else(|| Error::InvalidProblem(format!("unknown backend {name:?}")))
}

mod shipped;
pub use shipped::SHIPPED;
