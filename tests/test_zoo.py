"""The benchmark's model zoo (``cuconv.tools.zoo``) on the CPU: the names ``--models`` expands, the U-Net's
shapes and its fused conversion against the original, the training loss for class scores and score maps."""

import pytest

torch = pytest.importorskip("torch")

from cuconv.tools import bench_models, zoo  # noqa: E402


def test_model_names_expand_models_and_zoo_once_each():
    assert bench_models.model_names("models") == list(zoo.MODELS)
    names = bench_models.model_names("resnet50,zoo,unet,,models")
    assert names[0] == "resnet50" and len(names) == len(set(names)) == len(set(zoo.MODELS + zoo.ZOO))
    assert len(zoo.ZOO) >= 15 and "unet" in zoo.ZOO


def test_unet_fused_matches_the_original():
    import cuconv.nn

    torch.manual_seed(0)
    model = zoo.UNet(classes=3, widths=(8, 16, 16, 32, 32)).eval()
    with torch.no_grad():
        for m in model.modules():  # (non-trivial statistics, so that folding them matters)
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 32, 48)
    fused = cuconv.nn.convert(model, fuse=True)
    assert sum(type(m).__name__ == "FusedConv2d" for m in fused.modules()) == 18  # every conv-BN-ReLU
    with torch.no_grad():
        ref, got = model.double()(x.double()), fused.double()(x.double())
    assert got.shape == (2, 3, 32, 48)
    assert float((got - ref).norm() / ref.norm()) < 1e-12


def test_loss_takes_class_scores_and_score_maps():
    labels = torch.tensor([3, 1000 + 1])
    scores = torch.randn(2, 10, requires_grad=True)
    expected = torch.nn.functional.cross_entropy(scores, torch.tensor([3, 1001 % 10]))
    assert torch.equal(zoo.loss(scores, labels), expected)
    maps = torch.randn(2, 4, 5, 6)
    per_pixel = torch.tensor([3, 1]).view(2, 1, 1).expand(2, 5, 6)
    assert torch.allclose(zoo.loss(maps, labels), torch.nn.functional.cross_entropy(maps, per_pixel))


def test_video_models_take_clips():
    assert bench_models.model_names("video") == list(zoo.VIDEO)
    assert zoo.sample_shape("r3d_18", 224) == (3, 16, 112, 112) and zoo.sample_shape("resnet50", 160) == (3, 160, 160)
    assert bench_models._format((3, 16, 112, 112)) is torch.channels_last_3d
    assert bench_models._format((3, 224, 224)) is torch.channels_last


def test_layer_zoo_collects_distinct_convolutions_per_batch_on_the_meta_device():
    from cuconv.tools import layer_zoo

    layers = layer_zoo.collect(["unet"], [1, 2], image=32)
    one = layer_zoo.collect(["unet"], [1], image=32)
    # the U-Net's 19 convolutions (18 in its double convolutions, the head), each batch its own shapes
    assert len(layers) == 2 * len(one) and len(one) < 19
    assert sum(layer["models"]["unet"] for layer in layers) == 2 * 19
    assert {layer["shape"][0] for layer in layers} == {1, 2}
    first = layers[0]
    assert first["shape"] == (1, 3, 32, 32) and first["geometry"]["kernel_size"] == (3, 3)


def test_decoder_and_sequence_models_build_convert_and_match_torch():
    """``--models decoders`` and ``sequence``: the transposed-convolution U-Net and the three sequence models build,
    take their samples, and converted (every convolution cuconv's) match the original in float64."""
    import copy

    import cuconv.nn

    assert bench_models.model_names("decoders,sequence") == list(zoo.DECODERS + zoo.SEQUENCE)
    assert bench_models._format(zoo.sample_shape("mamba_mixer", 224)) is torch.contiguous_format
    for name in zoo.DECODERS + zoo.SEQUENCE:
        torch.manual_seed(0)
        model = zoo.build(name).double().eval()
        sample = zoo.sample_shape(name, 32)
        if name in zoo.SEQUENCE:  # (shorter than the benchmark's, the same layers)
            sample = (sample[0], min(sample[1], 800))
        else:
            model = zoo.UNet(classes=3, widths=(8, 16, 16, 32, 32), up="transposed").double().eval()
        converted = cuconv.nn.convert(copy.deepcopy(model))
        convs = [m for m in converted.modules()
                 if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.ConvTranspose2d))]
        assert convs and all(type(m).__module__.startswith("cuconv") for m in convs)
        x = torch.randn(2, *sample, dtype=torch.float64)
        with torch.no_grad():
            ref, got = model(x), converted(x)
        assert got.shape == ref.shape and got.dim() in (2, 4), (name, got.shape)
        if name == "unet_transposed":
            assert sum(isinstance(m, torch.nn.ConvTranspose2d) for m in convs) == 4
        assert float((got - ref).norm() / ref.norm()) < 1e-12, name
