"""Multimodal encoder inputs: image-size classes, processed dummy images and
an encoder-decoder model's processed dummy audio.

A multimodal model's processor (vLLM's ``BaseMultiModalProcessor``, the one
the engine's input processor and ``MultiModalBudget`` use) resizes every image
to one of a few shapes; each shape is one encoder batch shape and one number
of placeholder tokens in the prompt. :func:`read_image_classes` finds those
classes by processing square dummy images of :data:`CANDIDATE_SIDES` pixels
(the profile keeps them as plain data); :func:`request_inputs` processes the
images a planned request carries into what ``NewRequestData`` sends: prompt
token ids with the placeholders where the processor puts them, and one
``MultiModalFeatureSpec`` per image (its ``MultiModalKwargsItem``, a
``PlaceholderRange``, an identifier that keys the runner's encoder cache).

An encoder-decoder model (Whisper) takes its encoder input as a multimodal
item too: :func:`dummy_audio` is the waveform stepwarm sends (and
:mod:`stepwarm.verify` hands ``LLM.generate``), :func:`audio_inputs` its
``MultiModalFeatureSpec`` as the processor makes it.

This is the only module that calls a model's multimodal processor (the
worker's, :attr:`stepwarm.worker_view.WorkerView.mm_processor`); it reads
vLLM's processor API, guarded, and returns nothing when it is missing.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stepwarm.plan import PlannedRequest
from stepwarm.profile import ImageClass

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

#: Sides (pixels) of the square dummy images whose processed shapes make the
#: image classes: from a thumbnail to a large photo.
CANDIDATE_SIDES = (16, 28, 56, 112, 224, 448, 896, 1344)


@dataclass(frozen=True)
class RequestInputs:
    """What ``NewRequestData`` carries for a request with images."""

    #: Prompt token ids: the processor's (placeholders included), then
    #: filler ids up to the planned ``prompt_len``.
    prompt_token_ids: list[int]
    #: One ``MultiModalFeatureSpec`` per image, in prompt order.
    mm_features: list[Any]


class RunProcessor:
    """The model's multimodal processor for one run, made once
    (:attr:`~stepwarm.worker_view.WorkerView.mm_processor`: the V2 runner has
    none of its own, so each request would make one), and its output on
    :func:`dummy_audio`, processed once (every encoder-decoder request's
    encoder input is the same). On the H200 Whisper's start-up paid tens of
    ms per request for both, about a minute over the ``all`` set."""

    def __init__(self, worker: WorkerView):
        self._worker = worker

    @functools.cached_property
    def processor(self) -> Any:
        return self._worker.mm_processor

    @functools.cached_property
    def audio(self) -> Any:
        """The processor's output on the dummy audio; None for a model with
        no audio processor."""
        processor = self.processor
        if processor is None or "audio" not in getattr(processor.info, "supported_mm_limits", {}):
            return None
        items = processor.info.parse_mm_data(
            {"audio": [dummy_audio(audio_sampling_rate(processor))]})
        return processor("", items, hf_processor_mm_kwargs={})


def _process(processor: Any, sides: list[int]) -> Any:
    """Run the processor on its dummy text for ``len(sides)`` images, with
    white square images of those sides (``MultiModalInput``)."""
    from PIL import Image

    images = [Image.new("RGB", (s, s), color=255) for s in sides]
    text = processor.dummy_inputs.get_dummy_text({"image": len(sides)})
    items = processor.info.parse_mm_data({"image": images})
    return processor(text, items, hf_processor_mm_kwargs={})


def _num_embeds(placeholder: Any) -> int:
    is_embed = getattr(placeholder, "is_embed", None)
    return int(placeholder.length if is_embed is None else int(is_embed.sum()))


def read_image_classes(worker: WorkerView) -> tuple[tuple[ImageClass, ...], int, int]:
    """The image classes of the worker's model, its encoder budget and the most
    images one prompt may carry.

    Returns:
        ``(classes, encoder_budget, max_images_per_prompt)``: one
        :class:`ImageClass` per distinct processed shape among
        :data:`CANDIDATE_SIDES` (smallest side first), the encoder tokens one
        step may run (``MultiModalBudget.get_encoder_budget()``: the compute
        budget and the encoder cache size, the smaller) and
        ``mm_max_items_per_prompt["image"]``; for a model without an image
        processor ``((), budget, 0)``, the budget an encoder-decoder's
        encoder inputs get (0 for any other model).
    """
    processor = worker.mm_processor
    if processor is None or "image" not in getattr(processor.info, "supported_mm_limits", {}):
        return (), _encoder_decoder_budget(worker), 0
    classes: dict[tuple[int, int], ImageClass] = {}
    for side in CANDIDATE_SIDES:
        out = _process(processor, [side])
        placeholder = out["mm_placeholders"]["image"][0]
        key = (_num_embeds(placeholder), len(out["prompt_token_ids"]))
        classes.setdefault(key, ImageClass(side=side, tokens=key[0], prompt_tokens=key[1]))
    budget = worker.mm_budget
    if budget is not None:  # V1 runner: vLLM's own MultiModalBudget
        encoder_budget = int(budget.get_encoder_budget())
        max_images = int(budget.mm_max_items_per_prompt.get("image", 0))
    else:  # V2 runner: compute_mm_encoder_budget's rule from the scheduler config
        sc = worker.vllm_config.scheduler_config
        largest = max(c.tokens for c in classes.values())
        encoder_budget = max(min(int(sc.max_num_encoder_input_tokens),
                                 int(sc.encoder_cache_size)), largest)
        limit = int(processor.info.allowed_mm_limits.get("image", 1))
        max_images = max(1, min(limit, worker.vllm_config.model_config.max_model_len // largest))
    return tuple(classes.values()), encoder_budget, max_images


def request_inputs(shared: RunProcessor, req: PlannedRequest, classes: tuple[ImageClass, ...],
                   filler: list[int]) -> RequestInputs:
    """Process ``req``'s images (one square image per class index in
    ``req.images``) through the model's processor.

    Args:
        shared: the run's :class:`RunProcessor`.
        req: a request with ``images``.
        classes: the profile's image classes.
        filler: token ids to pad the prompt with, up to ``req.prompt_len``.

    Raises:
        ValueError: the processor made a prompt longer than ``req.prompt_len``
            (the plan under-counted the tokens its images add).
    """
    from vllm.multimodal.inputs import MultiModalFeatureSpec

    out = _process(shared.processor, [classes[c].side for c in req.images])
    ids = list(out["prompt_token_ids"])
    if len(ids) > req.prompt_len:
        raise ValueError(f"request {req.req_id}: its {len(req.images)} image(s) make a "
                         f"{len(ids)}-token prompt, more than its prompt_len {req.prompt_len}")
    ids += filler[len(ids):req.prompt_len]
    features = [
        MultiModalFeatureSpec(data=item, modality="image", identifier=image_identifier(req, i),
                              mm_position=placeholder)
        for i, (item, placeholder) in enumerate(zip(out["mm_kwargs"]["image"],
                                                    out["mm_placeholders"]["image"]))
    ]
    return RequestInputs(prompt_token_ids=ids, mm_features=features)


def image_identifier(req: PlannedRequest, index: int) -> str:
    """The encoder-cache key of ``req``'s image ``index``
    (``MultiModalFeatureSpec.identifier``, freed through
    ``SchedulerOutput.free_encoder_mm_hashes``)."""
    return f"{req.req_id}image{index}"


def _encoder_decoder_budget(worker: WorkerView) -> int:
    """An encoder-decoder model's encoder budget: the encoder tokens one step
    may start (``MultiModalBudget.get_encoder_budget()``, the scheduler's
    ``max_num_encoder_input_tokens`` and encoder cache size, the smaller; on
    the V2 runner the same from the scheduler config, at least
    ``max_encoder_len``); 0 for any other model."""
    model_config = worker.vllm_config.model_config
    if not getattr(model_config, "is_encoder_decoder", False):
        return 0
    budget = worker.mm_budget
    if budget is not None:
        return int(budget.get_encoder_budget())
    sc = worker.vllm_config.scheduler_config
    largest = worker.max_encoder_len
    return max(min(int(sc.max_num_encoder_input_tokens), int(sc.encoder_cache_size)), largest)


#: The dummy audio of encoder-decoder requests: a sine of this frequency (Hz),
#: amplitude and duration (s), at the feature extractor's sampling rate.
AUDIO_TONE = (440.0, 0.1, 1.0)


def dummy_audio(sampling_rate: int) -> tuple[Any, int]:
    """The waveform every encoder-decoder request carries, as vLLM's
    ``multi_modal_data["audio"]`` takes it: ``(float32 array of
    sampling_rate * AUDIO_TONE[2] samples, sampling_rate)``; deterministic, so
    :mod:`stepwarm.verify` hands ``LLM.generate`` the very same audio."""
    import numpy as np

    freq, amplitude, seconds = AUDIO_TONE
    t = np.arange(int(sampling_rate * seconds)) / sampling_rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32), int(sampling_rate)


def audio_sampling_rate(processor: Any) -> int:
    """The sampling rate (Hz) of the processor's feature extractor
    (``WhisperFeatureExtractor.sampling_rate``: 16000)."""
    return int(processor.info.get_feature_extractor().sampling_rate)


def audio_inputs(shared: RunProcessor, req: PlannedRequest,
                 prompt: list[int]) -> RequestInputs | None:
    """The encoder input of an encoder-decoder request: :func:`dummy_audio`
    through the model's processor (``EncDecMultiModalProcessor.apply`` on an
    empty encoder prompt, as vLLM's front end processes
    ``{"encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": ...}}}``),
    one ``MultiModalFeatureSpec`` (modality "audio", the processed
    ``input_features``, ``PlaceholderRange(offset=0, length=encoder tokens)``,
    identifier :func:`encoder_identifier`).

    Args:
        shared: the run's :class:`RunProcessor` (its audio processed once).
        req: a request with ``encoder_len``.
        prompt: its decoder prompt token ids (kept as they are).

    Returns:
        The inputs, or None when the model has no audio processor or the
        processed audio's encoder length is not ``req.encoder_len`` (the
        processor pads every audio to one length, Whisper's 1500 tokens: a
        request planned shorter keeps a dummy encoder input without data).
    """
    from vllm.multimodal.inputs import MultiModalFeatureSpec

    out = shared.audio
    if out is None:
        return None
    placeholder = out["mm_placeholders"]["audio"][0]
    if placeholder.length != req.encoder_len:
        return None
    feature = MultiModalFeatureSpec(data=out["mm_kwargs"]["audio"][0], modality="audio",
                                    identifier=encoder_identifier(req), mm_position=placeholder)
    return RequestInputs(prompt_token_ids=list(prompt), mm_features=[feature])


def encoder_identifier(req: PlannedRequest) -> str:
    """The encoder-cache key of an encoder-decoder request's encoder input
    (freed through ``SchedulerOutput.free_encoder_mm_hashes``)."""
    return f"{req.req_id}encoder"
