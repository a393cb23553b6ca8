//! DLPack export of the communicator's registered buffers: a capsule (legacy `dltensor`, or `dltensor_versioned`
//! when the consumer asks for DLPack 1.x) whose deleter keeps the buffer's owner alive until the consumer's tensor
//! is gone, so `torch.from_dlpack` and `numpy.from_dlpack` view the buffer without a copy.

use collective_core::DType;
use pyo3::ffi;
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// DLPack's device types (dlpack.h `DLDeviceType`).
pub const CPU: i32 = 1;
pub const CUDA: i32 = 2;
pub const ROCM: i32 = 10;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

/// What a capsule's tensor keeps alive: the buffer's owner (a Python object), its shape and strides, and the
/// owner's count of live views (a communicator refuses to close while any is alive).
struct Context {
    _owner: Py<PyAny>,
    shape: [i64; 1],
    strides: [i64; 1],
    views: Arc<AtomicUsize>,
}

/// A view of `count` elements of `dtype` at `ptr` on `device` (DLPack's type and id).
pub struct View {
    pub ptr: u64,
    pub count: usize,
    pub dtype: DType,
    pub device: (i32, i32),
}

fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::Bf16 => (4, 16),
        DType::F16 => (2, 16),
        DType::F32 => (2, 32),
    };
    DLDataType { code, bits, lanes: 1 }
}

/// A DLPack capsule of `view`, keeping `owner` alive (and counted in `views`) until its consumer lets it go.
pub fn capsule(
    py: Python<'_>,
    view: &View,
    owner: Py<PyAny>,
    views: Arc<AtomicUsize>,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let count = i64::try_from(view.count).expect("a buffer's element count fits i64");
    views.fetch_add(1, Ordering::SeqCst);
    let ctx = Box::into_raw(Box::new(Context { _owner: owner, shape: [count], strides: [1], views }));
    // SAFETY: `ctx` was just leaked from a Box and is freed only by the deleter below.
    let (shape, strides) = unsafe { ((*ctx).shape.as_mut_ptr(), (*ctx).strides.as_mut_ptr()) };
    let tensor = DLTensor {
        data: view.ptr as *mut c_void,
        device: DLDevice { device_type: view.device.0, device_id: view.device.1 },
        ndim: 1,
        dtype: dl_dtype(view.dtype),
        shape,
        strides,
        byte_offset: 0,
    };
    let (ptr, name, destructor): (*mut c_void, &CStr, ffi::PyCapsule_Destructor) = if versioned {
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx.cast(),
            deleter: Some(delete_versioned),
            flags: 0,
            dl_tensor: tensor,
        });
        (Box::into_raw(managed).cast(), VERSIONED, capsule_versioned)
    } else {
        let managed = Box::new(DLManagedTensor { dl_tensor: tensor, manager_ctx: ctx.cast(), deleter: Some(delete) });
        (Box::into_raw(managed).cast(), LEGACY, capsule_legacy)
    };
    // SAFETY: `ptr` is a live managed tensor owned by the capsule until a consumer renames it and takes it over.
    let raw = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if raw.is_null() {
        // SAFETY: the capsule was not made, so the managed tensor is still ours to free.
        unsafe {
            if versioned {
                delete_versioned(ptr.cast());
            } else {
                delete(ptr.cast());
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, raw) }.unbind())
}

/// Frees a context, wherever the consumer drops its tensor (any thread): the owner's reference is released with
/// the interpreter attached, or leaked when it is shutting down.
///
/// # Safety
/// `ctx` came from [`capsule`] and is freed once.
unsafe fn release(ctx: *mut c_void) {
    // SAFETY: the caller's contract.
    let ctx = unsafe { Box::from_raw(ctx.cast::<Context>()) };
    ctx.views.fetch_sub(1, Ordering::SeqCst);
    let _ = Python::try_attach(|_| drop(ctx));
}

unsafe extern "C" fn delete(managed: *mut DLManagedTensor) {
    // SAFETY: DLPack calls the deleter once, on the tensor [`capsule`] leaked.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: its context, freed once with it.
    unsafe { release(managed.manager_ctx) };
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: as `delete`.
    let managed = unsafe { Box::from_raw(managed) };
    // SAFETY: as `delete`.
    unsafe { release(managed.manager_ctx) };
}

/// A capsule no consumer took is still named `name`: free its tensor; a consumer renames the capsule when it takes
/// the tensor over, and the deleter is then the consumer's to call.
///
/// # Safety
/// Called by Python as a capsule destructor, the GIL held.
unsafe fn unconsumed(capsule: *mut ffi::PyObject, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: the caller's contract; PyCapsule_IsValid sets no error.
    unsafe {
        (ffi::PyCapsule_IsValid(capsule, name.as_ptr()) == 1).then(|| ffi::PyCapsule_GetPointer(capsule, name.as_ptr()))
    }
}

unsafe extern "C" fn capsule_legacy(capsule: *mut ffi::PyObject) {
    // SAFETY: Python's destructor call on a capsule of [`capsule`], whose pointer is a DLManagedTensor.
    unsafe {
        if let Some(p) = unconsumed(capsule, LEGACY) {
            delete(p.cast());
        }
    }
}

unsafe extern "C" fn capsule_versioned(capsule: *mut ffi::PyObject) {
    // SAFETY: as `capsule_legacy`, for the versioned struct.
    unsafe {
        if let Some(p) = unconsumed(capsule, VERSIONED) {
            delete_versioned(p.cast());
        }
    }
}
