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

- ``unet_transposed``: the same U-Net upsampling by 2x2 transposed convolutions of stride 2 (the original's
  up-convolutions; ``cuconv.nn.ConvTranspose2d``);
- the sequence models of ``SEQUENCE``, on (channels, length) samples, their outputs averaged over the sequence
  (N, channels): ``mamba_mixer``, four Mamba mixer blocks (a linear projection to twice the model width, the
  depthwise causal conv1d of kernel 4 on one half, SiLU, gated by the other, projected back, residual;
  width 768, 2,048 steps); ``conformer_conv``, four Conformer convolution modules (pointwise conv1d to twice
  the width, GLU, depthwise conv1d of kernel 31, BatchNorm1d, SiLU, pointwise conv1d, residual; width 256,
  1,024 steps); ``wav2vec2_features``, wav2vec 2.0's feature encoder (seven conv1d layers of 512 channels,
  kernels 10, 3, 3, 3, 3, 2, 2 and strides 5, 2, 2, 2, 2, 2, 2, GroupNorm after the first, GELU; one second of
  16 kHz audio).

``ZOO`` names the wider set the benchmark is judged on beside ``MODELS`` (MODELS.md's five): other
torchvision families, segmentation, a detection backbone and a U-Net. ``VIDEO``: torchvision's video models
(3-D convolutions, ``cuconv.nn.Conv3d``), whose inputs are clips (``sample_shape``). ``DECODERS``: models whose
upsampling is transposed convolutions. ``SEQUENCE``: models of 1-D convolutions (``cuconv.nn.Conv1d``).
"""

from __future__ import annotations

import torch
import torch.nn as nn

__all__ = ["build", "loss", "sample_shape", "MODELS", "ZOO", "VIDEO", "DECODERS", "SEQUENCE"]

MODELS = ("resnet50", "mobilenet_v3_large", "efficientnet_b0", "regnet_y_800mf", "convnext_tiny")
ZOO = ("resnet18", "resnext50_32x4d", "wide_resnet50_2", "densenet121", "vgg11_bn", "googlenet", "mobilenet_v2",
       "shufflenet_v2_x1_0", "mnasnet1_0", "squeezenet1_1", "efficientnet_v2_s", "regnet_x_1_6gf",
       "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large", "fcn_resnet50", "fpn_resnet50", "unet")

VIDEO = ("r3d_18", "mc3_18", "r2plus1d_18")
DECODERS = ("unet_transposed",)
SEQUENCE = ("mamba_mixer", "conformer_conv", "wav2vec2_features")
# (channels, length) of a sequence model's sample
_SEQUENCE_SAMPLES = {"mamba_mixer": (768, 2048), "conformer_conv": (256, 1024), "wav2vec2_features": (1, 16000)}
_SEGMENTATION = ("fcn_", "deeplabv3_", "lraspp_")
_CLIP = (3, 16, 112, 112)  # (channels, frames, height, width) of the video models' Kinetics clips


def sample_shape(name: str, image: int) -> tuple:
    """One input sample of the model ``name``: a clip for the video models, (channels, length) for the sequence
    models, else ``(3, image, image)``."""
    if name in _SEQUENCE_SAMPLES:
        return _SEQUENCE_SAMPLES[name]
    return _CLIP if name in VIDEO else (3, image, image)


def build(name: str):
    """The model ``name`` (see the module's docstring), on the CPU, in training mode."""
    if name == "unet":
        return UNet()
    if name == "unet_transposed":
        return UNet(up="transposed")
    if name == "mamba_mixer":
        return _Blocks([_MambaMixer(768) for _ in range(4)])
    if name == "conformer_conv":
        return _Blocks([_ConformerConv(256) for _ in range(4)])
    if name == "wav2vec2_features":
        return _Wav2Vec2Features()
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
    the bottom (the bottom's halved, as upsampling adds no channels), ``classes`` score maps out; ``up``:
    ``"bilinear"`` upsampling, or ``"transposed"``, a 2x2 transposed convolution of stride 2 keeping the
    channels."""

    def __init__(self, in_channels: int = 3, classes: int = 2, widths=(64, 128, 256, 512, 512),
                 up: str = "bilinear"):
        super().__init__()
        if up not in ("bilinear", "transposed"):
            raise ValueError(f"UNet: up must be 'bilinear' or 'transposed', got {up!r}")
        w = widths
        self.down = nn.ModuleList([_double_conv(in_channels, w[0])]
                                  + [_double_conv(w[i], w[i + 1]) for i in range(len(w) - 1)])
        self.pool = nn.MaxPool2d(2)
        self.upsample = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        # up level i: the upsampled map (w[i + 1] channels, the bottom's included) with the skip's w[i]
        ups, transposed = [], []
        below = w[-1]
        for i in reversed(range(len(w) - 1)):
            out = w[i - 1] if i > 0 else w[0]
            if up == "transposed":
                transposed.append(nn.ConvTranspose2d(below, below, 2, stride=2))
            ups.append(_double_conv(below + w[i], out))
            below = out
        self.up = nn.ModuleList(ups)
        self.up_convs = nn.ModuleList(transposed) if up == "transposed" else None
        self.head = nn.Conv2d(w[0], classes, 1)

    def forward(self, x):
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for i, block in enumerate(self.up):
            x = self.upsample(x) if self.up_convs is None else self.up_convs[i](x)
            x = block(torch.cat([x, skips.pop()], dim=1))
        return self.head(x)


class _Blocks(nn.Module):
    """Sequence blocks in a row on (N, channels, length), the output averaged over the length: (N, channels)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x):
        return self.blocks(x).mean(2)


class _MambaMixer(nn.Module):
    """A Mamba mixer block's convolution path on (N, width, length): x + out(silu(causal_dwconv(a)) * silu(z)),
    (a, z) the input projected to twice ``expand`` times the width (the selective scan left out: what is timed
    is the depthwise causal conv1d of kernel ``kernel`` and the projections around it)."""

    def __init__(self, width: int, expand: int = 2, kernel: int = 4):
        super().__init__()
        inner = expand * width
        self.norm = nn.LayerNorm(width)
        self.project_in = nn.Linear(width, 2 * inner, bias=False)
        self.conv = nn.Conv1d(inner, inner, kernel, groups=inner, padding=kernel - 1)
        self.project_out = nn.Linear(inner, width, bias=False)

    def forward(self, x):
        length = x.shape[2]
        a, z = self.project_in(self.norm(x.transpose(1, 2))).chunk(2, dim=-1)
        a = nn.functional.silu(self.conv(a.transpose(1, 2))[..., :length])  # (causal: the first outputs alone)
        return x + self.project_out(a.transpose(1, 2) * nn.functional.silu(z)).transpose(1, 2)


class _ConformerConv(nn.Module):
    """A Conformer convolution module on (N, width, length): x + pw2(silu(bn(dw(glu(pw1(x))))))."""

    def __init__(self, width: int, kernel: int = 31):
        super().__init__()
        self.pw1 = nn.Conv1d(width, 2 * width, 1)
        self.dw = nn.Conv1d(width, width, kernel, padding=kernel // 2, groups=width, bias=False)
        self.bn = nn.BatchNorm1d(width)
        self.pw2 = nn.Conv1d(width, width, 1)

    def forward(self, x):
        y = nn.functional.glu(self.pw1(x), dim=1)
        return x + self.pw2(nn.functional.silu(self.bn(self.dw(y))))


class _Wav2Vec2Features(nn.Module):
    """wav2vec 2.0's feature encoder on (N, 1, samples): seven conv1d layers of ``width`` channels (kernels 10, 3,
    3, 3, 3, 2, 2; strides 5, 2, 2, 2, 2, 2, 2; no bias), GroupNorm over each channel after the first, GELU."""

    def __init__(self, width: int = 512):
        super().__init__()
        layers = [nn.Conv1d(1, width, 10, stride=5, bias=False), nn.GroupNorm(width, width), nn.GELU()]
        for kernel in (3, 3, 3, 3, 2, 2):
            layers += [nn.Conv1d(width, width, kernel, stride=2, bias=False), nn.GELU()]
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(x).mean(2)
