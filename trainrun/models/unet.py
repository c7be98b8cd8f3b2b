"""``model=unet2d|unet3d``: the nnU-Net network as MONAI's DynUNet builds it.

DynUNet is NVIDIA's nnU-Net (Deep Learning Examples), which Composer's BraTS UNet adapted: one
encoder level per stride (the first at stride 1), strided convolutions down, transposed
convolutions up, LeakyReLU 0.01, kaiming-normal initialisation. ``model.unet`` chooses the
published forms: Composer's 2D network (residual blocks, BatchNorm, filters 32-512, strides
1,2,2,2,2,2) and nnU-Net's 3D one (plain blocks, InstanceNorm). The output is one logit per class
and voxel at the input's size, whose sides must divide by the product of the strides. With
``model.unet.deep_supervision`` k, training returns (N, 1 + k, K, *spatial): the output and those of
the k decoder levels below it, upsampled (the segmentation task weighs their losses).
"""

from __future__ import annotations

from torch import nn

from trainrun.data.interface import TextFacts
from trainrun.schema import ModelConfig


def build(config: ModelConfig, text: TextFacts | None = None) -> nn.Module:
    """MONAI's DynUNet with ``model.unet``'s levels and ``model.num_classes`` outputs."""
    from monai.networks.nets import DynUNet

    unet = config.unet
    norm = ("batch", {"affine": True}) if unet.norm == "batch" else ("instance", {"affine": True})
    return DynUNet(
        spatial_dims=unet.dimensions,
        in_channels=unet.in_channels,
        out_channels=config.num_classes,
        kernel_size=[3] * len(unet.strides),
        strides=list(unet.strides),
        upsample_kernel_size=list(unet.strides[1:]),
        filters=list(unet.filters),
        norm_name=norm,
        act_name=("leakyrelu", {"inplace": True, "negative_slope": 0.01}),
        res_block=unet.residual,
        deep_supervision=unet.deep_supervision > 0,
        deep_supr_num=max(unet.deep_supervision, 1),
    )
