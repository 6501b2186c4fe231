"""The models ``python -m cuconv bench --models`` builds: torchvision's by name, and a zoo beyond them.

``build(name)`` returns a ``torch.nn.Module`` whose forward gives one tensor, randomly initialised (nothing is
downloaded: torchvision's ``weights=None`` and, for segmentation, ``weights_backbone=None``):

- any torchvision classification model by its name (``torchvision.models.get_model``), ``googlenet`` without
  its auxiliary heads (whose tuple of outputs in training mode no loss here takes);
- torchvision's segmentation models by name (``fcn_resnet50``, ``deeplabv3_mobilenet_v3_large``,
  ``lraspp_mobilenet_v3_large``, ...), their ``"out"`` map: per-pixel class scores at the input's size;
- ``fpn_resnet50``: the ResNet-50 + feature pyramid backbone of torchvision's detection models (with BatchNorm
  in place of its frozen one, so that it trains and folds as a detector being trained does), its five levels
  each averaged over the plane and summed (N, 256), so every level is computed and used;
- ``unet``: a U-Net (Ronneberger et al.; two 3x3 conv-BatchNorm-ReLU per level, four levels down by max-pooling
  and up by bilinear upsampling, skip connections concatenated; 64 to 512 channels), its per-pixel scores.

``ZOO`` names the wider set the benchmark is judged on beside ``MODELS`` (MODELS.md's five): other
torchvision families, segmentation, a detection backbone and a U-Net. ``VIDEO``: torchvision's video models
(3-D convolutions, ``cuconv.nn.Conv3d``), whose inputs are clips (``sample_shape``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["build", "loss", "sample_shape", "MODELS", "ZOO", "VIDEO"]

MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_800mf", "convnext_tiny")
ZOO = ("resnet18", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "vgg11_bn", "googlenet", "mobilenet_v2",
       "shufflenet_v2_x1_0", "mnasnet1_0", "squeezenet1_1", "efficientnet_v2_s", "regnet_x_1_6gf",
       "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large", "fcn_resnet50", "fpn_resnet50", "unet")

VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18")
_SEGMENTATION = ("fcn_", "deeplabv3_", "lraspp_")
_CLIP = (3, 16, 112, 112)  # (channels, frames, height, width) of the video models' Kinetics clips


def sample_shape(name: str, image: int) -> tuple:
    """One input sample of the model ``name``: a clip for the video models, else ``(3, image, image)``."""
    return _CLIP if name in VIDEO else (3, image, image)


def build(name: str):
    """The model ``name`` (see the module's docstring), on the CPU, in training mode."""
    if name == "unet":
        return UNet()
    import torchvision

    if name == "fpn_resnet50":
        from torchvision.models.detection.backbone_utils import resnet_fpn_backbone

        return _Pooled(resnet_fpn_backbone(backbone_name="resnet50", weights=None, trainable_layers=5,
                                           norm_layer=torch.nn.BatchNorm2d))
    if name.startswith(_SEGMENTATION):
        return _Out(torchvision.models.get_model(name, weights=None, weights_backbone=None))
    if name == "googlenet":
        return torchvision.models.get_model(name, weights=None, aux_logits=False, init_weights=True)
    return torchvision.models.get_model(name, weights=None)


def loss(out, labels):
    """A training step's loss, not a plain sum (with BatchNorm training, a sum's gradient is mostly rounding):
    cross-entropy against ``labels`` (taken modulo the classes) for class scores (N, classes), and per pixel,
    every pixel of a sample its label, for score maps (N, classes, H, W)."""
    out = out.float()
    labels = labels % out.shape[1]
    if out.dim() == 4:
        labels = labels[:, None, None].expand(out.shape[0], out.shape[2], out.shape[3])
    return torch.nn.functional.cross_entropy(out, labels)


class _Out(nn.Module):
    """A segmentation model's ``"out"`` map alone (torchvision's return a dict, with ``"aux"`` when built so)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


class _Pooled(nn.Module):
    """A feature pyramid's levels, each averaged over its plane, summed: (N, channels)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        levels = list(self.model(x).values())
        out = levels[0].mean((2, 3))
        for level in levels[1:]:
            out = out + level.mean((2, 3))
        return out


def _double_conv(c_in: int, c_out: int):
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True),
                         nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out),
                         nn.ReLU(inplace=True))


class UNet(nn.Module):
    """A U-Net for inputs whose height and width divide by 16: ``widths`` channels at the four levels down and
    the bottom (the bottom's halved, as bilinear upsampling adds no channels), ``classes`` score maps out."""

    def __init__(self, in_channels: int = 3, classes: int = 2, widths=(64, 128, 256, 512, 512)):
        super().__init__()
        w = widths
        self.down = nn.ModuleList([_double_conv(in_channels, w[0])]
                                  + [_double_conv(w[i], w[i + 1]) for i in range(len(w) - 1)])
        self.pool = nn.MaxPool2d(2)
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        # up level i: the upsampled map (w[i + 1] channels, the bottom's included) with the skip's w[i]
        ups = []
        below = w[-1]
        for i in reversed(range(len(w) - 1)):
            out = w[i - 1] if i > 0 else w[0]
            ups.append(_double_conv(below + w[i], out))
            below = out
        self.up = nn.ModuleList(ups)
        self.head = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for block in self.up:
            x = block(torch.cat([self.upsample(x), skips.pop()], dim=1))
        return self.head(x)
