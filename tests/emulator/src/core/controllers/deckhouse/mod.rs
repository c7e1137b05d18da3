//! Deckhouse virtualization's controllers (deckhouse/virtualization): VirtualDisk
//! ([`disk`]), VirtualImage / ClusterVirtualImage ([`image`]), VirtualMachineClass and
//! VirtualMachine ([`vm`]) and VirtualMachineBlockDeviceAttachment ([`attachment`]).

mod attachment;
mod disk;
mod image;
mod vm;

pub(crate) use attachment::attachments_of;
pub(super) use attachment::vmbda;
pub(super) use disk::virtual_disk;
pub(crate) use image::image_target;
pub(super) use image::virtual_image;
pub(super) use vm::{deckhouse_vm, vm_class};

const DH: &str = "virtualization.deckhouse.io";
