//! Row-major 2-D device views: a cudarc view plus rows, columns and row stride, so a layer can check that what
//! it is handed has the shape it was planned for (a flat buffer only says it is long enough). Views into a
//! larger arena are allowed; the kernels read rows `stride` elements apart.

use cudarc::driver::{CudaSlice, CudaView, CudaViewMut};

use crate::error::{Error, Result};

fn check_extent(name: &'static str, len: usize, rows: usize, cols: usize, stride: usize) -> Result<()> {
    if cols == 0 || stride < cols {
        return Err(Error::Buffer {
            name,
            detail: format!("cols = {cols}, row stride = {stride}: cols must be positive and stride >= cols"),
        });
    }
    let need = if rows == 0 { 0 } else { (rows - 1) * stride + cols };
    if len < need {
        return Err(Error::Buffer {
            name,
            detail: format!("holds {len} elements, a [{rows}, {cols}] view with row stride {stride} needs {need}"),
        });
    }
    Ok(())
}

/// The extent of a 2-D view (rows, columns, row stride in elements), without its memory: what shape checks
/// read, so they can be tested without a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ViewShape {
    pub rows: usize,
    pub cols: usize,
    pub stride: usize,
}

impl ViewShape {
    /// `[rows, cols]` with packed rows.
    pub const fn packed(rows: usize, cols: usize) -> ViewShape {
        ViewShape { rows, cols, stride: cols }
    }
    /// Whether consecutive rows are adjacent (what kernels that read `rows · cols` elements need).
    pub const fn is_packed(&self) -> bool {
        self.stride == self.cols || self.rows <= 1
    }
}

impl std::fmt::Display for ViewShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}, {}]", self.rows, self.cols)?;
        if !self.is_packed() {
            write!(f, " (row stride {})", self.stride)?;
        }
        Ok(())
    }
}

/// A read-only `[rows, cols]` row-major view with a row stride (in elements).
#[derive(Debug)]
pub struct MatrixView<'a, T> {
    name: &'static str,
    view: CudaView<'a, T>,
    rows: usize,
    cols: usize,
    stride: usize,
}

impl<'a, T> MatrixView<'a, T> {
    /// The whole of `slice` as `[len / cols, cols]`.
    ///
    /// # Errors
    /// [`Error::Buffer`] if `cols` does not divide the slice's length.
    pub fn of(name: &'static str, slice: &'a CudaSlice<T>, cols: usize) -> Result<Self> {
        whole(name, slice.len(), cols).and_then(|rows| Self::new(name, slice.as_view(), rows, cols))
    }

    /// The underlying elements from the first row's start.
    pub fn as_view(&self) -> CudaView<'_, T> {
        self.view.slice(..)
    }

    /// Rows `lo..hi` as a view of their own.
    pub(crate) fn row_range(&self, lo: usize, hi: usize) -> MatrixView<'_, T> {
        let (start, end) = row_span(lo, hi, self.rows, self.cols, self.stride);
        MatrixView {
            name: self.name,
            view: self.view.slice(start..end),
            rows: hi - lo,
            cols: self.cols,
            stride: self.stride,
        }
    }
}

/// A writable `[rows, cols]` row-major view with a row stride (in elements).
#[derive(Debug)]
pub struct MatrixViewMut<'a, T> {
    name: &'static str,
    view: CudaViewMut<'a, T>,
    rows: usize,
    cols: usize,
    stride: usize,
}

impl<'a, T> MatrixViewMut<'a, T> {
    /// The whole of `slice` as `[len / cols, cols]`.
    ///
    /// # Errors
    /// [`Error::Buffer`] if `cols` does not divide the slice's length.
    pub fn of(name: &'static str, slice: &'a mut CudaSlice<T>, cols: usize) -> Result<Self> {
        let rows = whole(name, slice.len(), cols)?;
        Self::new(name, slice.as_view_mut(), rows, cols)
    }

    /// The underlying elements from the first row's start.
    pub fn as_view_mut(&mut self) -> CudaViewMut<'_, T> {
        self.view.slice_mut(..)
    }

    /// Rows `lo..hi` as a view of their own.
    pub(crate) fn row_range_mut(&mut self, lo: usize, hi: usize) -> MatrixViewMut<'_, T> {
        let (start, end) = row_span(lo, hi, self.rows, self.cols, self.stride);
        let (name, rows, cols, stride) = (self.name, hi - lo, self.cols, self.stride);
        MatrixViewMut { name, view: self.view.slice_mut(start..end), rows, cols, stride }
    }
}

/// The element range `start..end` of rows `lo..hi` (checked against `rows`) at `stride`, `cols` long each.
fn row_span(lo: usize, hi: usize, rows: usize, cols: usize, stride: usize) -> (usize, usize) {
    assert!(lo <= hi && hi <= rows, "row range {lo}..{hi} of {rows} rows");
    let end = if hi == lo { lo * stride } else { (hi - 1) * stride + cols };
    ((lo * stride).min(end), end)
}

/// The constructors and extent getters both views share (`$view`: the cudarc view type they hold).
macro_rules! matrix_view_common {
    ($ty:ident, $view:ident) => {
        impl<'a, T> $ty<'a, T> {
            /// `[rows, cols]` packed rows (stride = cols) at the start of `view`. `name` appears in error
            /// messages (`"x"`, `"topk_ids"`).
            ///
            /// # Errors
            /// [`Error::Buffer`] if `view` is shorter than `rows·cols` or `cols == 0`.
            pub fn new(name: &'static str, view: $view<'a, T>, rows: usize, cols: usize) -> Result<Self> {
                Self::with_stride(name, view, rows, cols, cols)
            }

            /// `[rows, cols]` with rows `stride` elements apart.
            ///
            /// # Errors
            /// [`Error::Buffer`] if `stride < cols`, `cols == 0` or `view` ends before the last row.
            pub fn with_stride(
                name: &'static str,
                view: $view<'a, T>,
                rows: usize,
                cols: usize,
                stride: usize,
            ) -> Result<Self> {
                check_extent(name, view.len(), rows, cols, stride)?;
                Ok($ty { name, view, rows, cols, stride })
            }

            pub fn rows(&self) -> usize {
                self.rows
            }
            pub fn cols(&self) -> usize {
                self.cols
            }
            pub fn stride(&self) -> usize {
                self.stride
            }
            pub fn name(&self) -> &'static str {
                self.name
            }
            pub fn shape(&self) -> ViewShape {
                ViewShape { rows: self.rows, cols: self.cols, stride: self.stride }
            }
        }
    };
}

matrix_view_common!(MatrixView, CudaView);
matrix_view_common!(MatrixViewMut, CudaViewMut);

fn whole(name: &'static str, len: usize, cols: usize) -> Result<usize> {
    if cols == 0 || len % cols != 0 {
        return Err(Error::Buffer {
            name,
            detail: format!("holds {len} elements, not a whole number of rows of {cols}"),
        });
    }
    Ok(len / cols)
}
