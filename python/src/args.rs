//! What a call's tensor is: its address, element count, dtype, memory and writability, read from a torch tensor
//! (`data_ptr()`; torch is looked up in `sys.modules`, never imported here) or from a host array exposing
//! `__array_interface__` (numpy, ml_dtypes' bfloat16). Layouts the kernels cannot take are refused here, by name.

use crate::errors::ArgumentError;
use collective_core::DType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyTuple};

/// Where a tensor's memory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Process memory: a numpy array or a CPU tensor.
    Host,
    /// A torch CUDA (or ROCm) tensor on this device index.
    Device(i64),
    /// A torch device this library has no driver for (`mps`, `xpu`, `meta`, ...).
    Other(String),
}

/// A call's tensor, as the checks and the call need it (owned, so a prepared call keeps it as it is).
pub struct Arg {
    pub obj: Py<PyAny>,
    pub ptr: u64,
    pub count: usize,
    pub dtype: DType,
    pub memory: Memory,
    pub writable: bool,
}

impl Arg {
    pub fn bytes(&self) -> usize {
        self.count * self.dtype.size()
    }

    /// Whether the byte ranges of `self` and `other` share any byte.
    pub fn overlaps(&self, other: &Arg) -> bool {
        self.ptr < other.ptr + other.bytes() as u64 && other.ptr < self.ptr + self.bytes() as u64
    }
}

/// The parts of torch a call uses, looked up once torch has been imported by the program.
pub struct Torch {
    tensor: Py<PyAny>,
    dtypes: [(Py<PyAny>, DType); 3],
    /// `torch._C._cuda_getCurrentRawStream(index)`: the current stream's handle without building a Stream object
    /// (what `torch.cuda.current_stream(index).cuda_stream` returns, several times faster).
    raw_stream: Option<Py<PyAny>>,
    current_stream: Py<PyAny>,
}

static TORCH: PyOnceLock<Torch> = PyOnceLock::new();

/// torch's parts, or `None` while the program has not imported torch (then no object can be a tensor).
pub fn torch(py: Python<'_>) -> PyResult<Option<&'static Torch>> {
    if let Some(t) = TORCH.get(py) {
        return Ok(Some(t));
    }
    let modules = py.import(intern!(py, "sys"))?.getattr(intern!(py, "modules"))?;
    let Some(torch) = modules.cast::<PyDict>()?.get_item("torch")? else {
        return Ok(None);
    };
    let dtype = |name: &str| torch.getattr(name).map(Bound::unbind);
    let c = torch.getattr("_C")?;
    let found = Torch {
        tensor: torch.getattr("Tensor")?.unbind(),
        dtypes: [(dtype("bfloat16")?, DType::Bf16), (dtype("float16")?, DType::F16), (dtype("float32")?, DType::F32)],
        raw_stream: c.getattr("_cuda_getCurrentRawStream").ok().map(Bound::unbind),
        current_stream: torch.getattr("cuda")?.getattr("current_stream")?.unbind(),
    };
    Ok(Some(TORCH.get_or_init(py, || found)))
}

impl Torch {
    /// The handle of torch's current stream on device `index`.
    pub fn current_stream(&self, py: Python<'_>, index: i64) -> PyResult<u64> {
        match &self.raw_stream {
            Some(f) => f.call1(py, (index,))?.extract(py),
            None => self.current_stream.call1(py, (index,))?.getattr(py, "cuda_stream")?.extract(py),
        }
    }
}

/// The dtype a name stands for: `"bf16"`, `"bfloat16"`, `torch.bfloat16`, `numpy.float16`, `np.dtype("float32")`.
pub fn dtype_of(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    let py = obj.py();
    let name: String = if let Ok(s) = obj.cast::<PyString>() {
        s.to_string()
    } else if let Ok(n) = obj.getattr(intern!(py, "name")).and_then(|n| n.extract::<String>()) {
        n
    } else if let Ok(n) = obj.getattr(intern!(py, "__name__")).and_then(|n| n.extract::<String>()) {
        n
    } else {
        obj.str()?.to_string()
    };
    let bare = name.strip_prefix("torch.").unwrap_or(&name);
    bare.parse().map_err(|_| {
        ArgumentError::new_err(format!("dtype {name}: the communicator reduces bfloat16, float16 and float32 only"))
    })
}

/// Reads `obj` (named `what` in errors) as a call's tensor; refuses a dtype other than bf16 / fp16 / fp32, a
/// non-contiguous layout, an empty tensor, and objects that are neither torch tensors nor host arrays.
pub fn describe<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Arg> {
    let py = obj.py();
    if let Some(torch) = torch(py)? {
        if obj.is_instance(torch.tensor.bind(py))? {
            return from_torch(obj, torch, what);
        }
    }
    if let Ok(ai) = obj.getattr(intern!(py, "__array_interface__")) {
        return from_array_interface(obj, &ai, what);
    }
    let kind = if obj.hasattr(intern!(py, "__cuda_array_interface__"))? {
        " (a device array other than a torch tensor: wrap it with torch.as_tensor, which shares its memory)"
    } else {
        ""
    };
    Err(ArgumentError::new_err(format!(
        "{what}: a {} is neither a torch.Tensor nor an array with __array_interface__ (numpy){kind}",
        obj.get_type().name()?
    )))
}

fn from_torch<'py>(obj: &Bound<'py, PyAny>, torch: &Torch, what: &str) -> PyResult<Arg> {
    let py = obj.py();
    let dt = obj.getattr(intern!(py, "dtype"))?;
    let Some(dtype) = torch.dtypes.iter().find(|(d, _)| d.bind(py).is(&dt)).map(|d| d.1) else {
        return Err(ArgumentError::new_err(format!(
            "{what}: dtype {}: the communicator reduces torch.bfloat16, torch.float16 and torch.float32 only",
            dt.str()?
        )));
    };
    if !obj.call_method0(intern!(py, "is_contiguous"))?.is_truthy()? {
        return Err(ArgumentError::new_err(format!(
            "{what}: not contiguous (strides {}): the kernels read one dense range; pass .contiguous()",
            obj.call_method0(intern!(py, "stride"))?.str()?
        )));
    }
    // `is_cuda` / `is_cpu` cost a tenth of `device.type`, which builds a torch.device; only other devices need it.
    let memory = if obj.getattr(intern!(py, "is_cuda"))?.is_truthy()? {
        Memory::Device(obj.call_method0(intern!(py, "get_device"))?.extract()?)
    } else if obj.getattr(intern!(py, "is_cpu")).and_then(|c| c.is_truthy()).unwrap_or(false) {
        Memory::Host
    } else {
        let kind: String = obj.getattr(intern!(py, "device"))?.getattr(intern!(py, "type"))?.extract()?;
        if kind == "cpu" {
            Memory::Host
        } else {
            Memory::Other(kind)
        }
    };
    let count: usize = obj.call_method0(intern!(py, "numel"))?.extract()?;
    nonempty(what, count)?;
    let ptr: u64 = obj.call_method0(intern!(py, "data_ptr"))?.extract()?;
    Ok(Arg { obj: obj.clone().unbind(), ptr, count, dtype, memory, writable: true })
}

fn from_array_interface<'py>(obj: &Bound<'py, PyAny>, ai: &Bound<'py, PyAny>, what: &str) -> PyResult<Arg> {
    let ai = ai.cast::<PyDict>()?;
    let get = |key: &str| -> PyResult<Bound<'py, PyAny>> {
        ai.get_item(key)?.ok_or_else(|| ArgumentError::new_err(format!("{what}: __array_interface__ lacks {key:?}")))
    };
    let typestr: String = get("typestr")?.extract()?;
    let dtype = match typestr.as_str() {
        "<f4" => DType::F32,
        "<f2" => DType::F16,
        // ml_dtypes' bfloat16 describes itself as two opaque bytes; its dtype's name says what they are.
        "<V2" | "|V2" if dtype_name(obj).as_deref() == Some("bfloat16") => DType::Bf16,
        _ => {
            let name = dtype_name(obj).unwrap_or(typestr);
            return Err(ArgumentError::new_err(format!(
                "{what}: dtype {name}: the communicator reduces bfloat16 (ml_dtypes), float16 and float32 only \
                 (little-endian)"
            )));
        }
    };
    let shape: Vec<usize> = get("shape")?.extract()?;
    let count = shape.iter().product();
    let strides = ai.get_item("strides")?.filter(|s| !s.is_none());
    if let Some(strides) = strides {
        let strides: Vec<isize> = strides.extract()?;
        if !c_contiguous(&shape, &strides, dtype.size()) {
            return Err(ArgumentError::new_err(format!(
                "{what}: not C-contiguous (strides {strides:?} bytes for shape {shape:?}): the kernels read one dense \
                 range; pass numpy.ascontiguousarray(...)"
            )));
        }
    }
    if ai.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(ArgumentError::new_err(format!("{what}: masked arrays are not reduced")));
    }
    nonempty(what, count)?;
    let data = get("data")?;
    let data = data.cast::<PyTuple>().map_err(|_| {
        ArgumentError::new_err(format!("{what}: __array_interface__ gives its data as a buffer object, not an address"))
    })?;
    let (ptr, readonly): (u64, bool) = data.extract()?;
    Ok(Arg { obj: obj.clone().unbind(), ptr, count, dtype, memory: Memory::Host, writable: !readonly })
}

fn dtype_name(obj: &Bound<'_, PyAny>) -> Option<String> {
    obj.getattr("dtype").ok()?.getattr("name").ok()?.extract().ok()
}

/// Whether `strides` (bytes) lay `shape` out densely in C order; dimensions of one element may have any stride.
fn c_contiguous(shape: &[usize], strides: &[isize], elem: usize) -> bool {
    let mut want = elem as isize;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != want {
            return false;
        }
        want *= n as isize;
    }
    shape.len() == strides.len()
}

fn nonempty(what: &str, count: usize) -> PyResult<()> {
    if count == 0 {
        return Err(ArgumentError::new_err(format!("{what}: empty (0 elements): a call reduces at least one")));
    }
    Ok(())
}
