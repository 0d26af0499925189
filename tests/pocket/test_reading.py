"""
Dense reading supervision (arr_coc.pocket.reading): each merged cell's targets are its characters in reading order, in
the ViT's raster order of cells; the hook sees exactly the visual tokens the LLM reads; the head trains and resumes.
"""

import pytest
import torch

from arr_coc.synth.fineprint import Glyph, PageStyle, make_page
from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.pocket.data import IGNORE, collate, model_inputs
from arr_coc.pocket.model import image_processor
from arr_coc.pocket.trainer import HEAD_FILE, PocketTrainConfig, _train_step, load_or_init, make_optimizer, train
from arr_coc.pocket.reading import (ALPHABET, NONE, PATCH_SLOTS, SLOTS, MergerOutputHook, ReadingHead,
                                    glyph_targets, patch_targets, reading_targets)


def _decode(targets) -> list[str]:
    """Each cell's characters, as a string."""
    return ["".join(ALPHABET[c - 1] for c in row if c != NONE) for row in targets.tolist()]


def test_a_cell_names_its_characters_line_by_line_left_to_right_in_raster_order():
    glyphs = [Glyph(20, 10, "B"), Glyph(5, 10, "A"), Glyph(3, 20, "C"),  # cell (0, 0): two lines
              Glyph(30, 2, "D"),  # cell (0, 1)
              Glyph(2, 30, "E"),  # cell (1, 0): the next row starts at index gw
              Glyph(83.9, 55.9, "F")]  # the last cell of a 3 x 2 grid
    cells = _decode(glyph_targets(glyphs, width=84, height=56))
    assert cells == ["ABC", "D", "", "E", "", "F"]


def test_a_cell_holds_at_most_slots_characters():
    glyphs = [Glyph(1 + i, 5, ch) for i, ch in enumerate("ABCDEFGHI")]
    targets = glyph_targets(glyphs, 28, 28)
    assert targets.shape == (1, SLOTS) and _decode(targets) == ["ABCDEFGHI"[:SLOTS]]


def test_each_patch_names_its_characters_in_the_vits_merge_window_order():
    """A 56 x 28 page is two cells of 2 x 2 patches (14 px): each patch's characters sit in its cell's row, top left,
    top right, bottom left, bottom right, as the ViT orders the patches it merges."""
    glyphs = [Glyph(3, 3, "A"), Glyph(9, 5, "B"),  # cell 0, top left: one line, left to right
              Glyph(20, 5, "C"),  # cell 0, top right
              Glyph(5, 20, "D"),  # cell 0, bottom left
              Glyph(40, 22, "E"), Glyph(55.5, 27.5, "F")]  # cell 1: bottom left, bottom right
    targets = patch_targets(glyphs, width=56, height=28)
    assert targets.shape == (2, 4 * PATCH_SLOTS)
    patches = [_decode(row.reshape(4, PATCH_SLOTS)) for row in targets]
    assert patches == [["AB", "C", "D", ""], ["", "", "E", "F"]]
    both = reading_targets(glyphs, 56, 28)
    assert _decode(both[:, :SLOTS]) == ["ABCD", "EF"] and (both[:, SLOTS:] == targets).all()


def test_a_pages_targets_spell_its_field():
    """A clean page with one field: its cells, in raster order, spell the field as drawn (spaces aside)."""
    page = make_page("fine_print", 3, 448, style=PageStyle(fields=(1, 1), clutter=0.0))
    (question,) = page.questions
    assert "".join(_decode(glyph_targets(page.glyphs, 448, 448))) == question.text.replace(" ", "")
    patches = patch_targets(page.glyphs, 448, 448).reshape(16, 16, 2, 2, PATCH_SLOTS).transpose(0, 2, 1, 3, 4)
    assert "".join(_decode(patches.reshape(32 * 32, PATCH_SLOTS))) == question.text.replace(" ", "")  # patch raster


@pytest.fixture(scope="module")
def stock():
    from transformers import AutoTokenizer, Qwen2VLForConditionalGeneration

    model = Qwen2VLForConditionalGeneration.from_pretrained(str(POCKET_FOLDER), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(POCKET_FOLDER))


def _batch(stock, kinds=("fine_print", "box_word"), gestalt_first=False):
    model, tokenizer = stock
    pages = [make_page(kind, 5, 224, 168) for kind in kinds]
    batch = collate(tokenizer, [p.image for p in pages], [[(p.questions[0].question, p.questions[0].answer)]
                                                          for p in pages],
                    [reading_targets(p.glyphs, 224, 168) for p in pages], gestalt_first)
    return model_inputs(batch, image_processor(), model.config.image_token_id, "cpu"), batch["reading"]


def test_the_hook_holds_the_visual_tokens_the_llm_reads(stock):
    model, _ = stock
    inputs, reading = _batch(stock)
    with torch.no_grad(), MergerOutputHook(model) as visual:
        model(**inputs)
        reference = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"]).pooler_output
    torch.testing.assert_close(visual.value, torch.cat(reference))
    assert visual.value.shape[0] == reading.shape[0] == 2 * 8 * 6  # one target row per merged token
    with torch.no_grad():  # the patches the merger merges: the last block's, 4 a token
        merged = model.model.visual.merger(visual.patches)
    torch.testing.assert_close(merged, visual.value)
    assert visual.patches.shape == (4 * 2 * 8 * 6, model.config.vision_config.embed_dim)
    assert not model.model.visual._forward_hooks  # removed on exit


def test_with_the_gestalt_first_only_the_pages_tokens_have_reading_targets(stock):
    """Each conversation's gestalt view, then its page: the targets follow the ViT's token order, and the gestalt's
    rows are ignored by the loss, so the head is trained on the same page tokens as without it."""
    model, _ = stock
    _, page_targets = _batch(stock)
    inputs, reading = _batch(stock, gestalt_first=True)
    with torch.no_grad(), MergerOutputHook(model) as visual:
        model(**inputs)
    assert visual.value.shape[0] == reading.shape[0] == 2 * (14 * 18 + 6 * 8)  # ARR's gestalt of 224x168 px: 14x18
    ignored = (reading == IGNORE).all(1)  # [tokens]
    assert ignored.tolist() == ([True] * 252 + [False] * 48) * 2
    assert torch.equal(reading[~ignored], page_targets)
    head = ReadingHead(model.config.vision_config.hidden_size)
    with torch.no_grad():
        page_tokens = visual.value[~ignored]
        torch.testing.assert_close(head(visual.value, reading), head(page_tokens, page_targets))
        assert head.accuracy(visual.value, reading) == head.accuracy(page_tokens, page_targets)


def test_a_training_step_trains_the_heads_on_their_losses(stock):
    import copy

    from arr_coc.pocket.binding import BindingHead, aligned_ids, binding_targets
    from arr_coc.pocket.trainer import Trainee

    model = copy.deepcopy(stock[0]).train()
    inputs, reading = _batch(stock)
    pages = [make_page(kind, 5, 224, 168) for kind in ("fine_print", "box_word")]
    binding = torch.from_numpy(__import__("numpy").concatenate([binding_targets(p.marks, 224, 168) for p in pages]))
    head, bound = ReadingHead(model.config.vision_config.hidden_size), BindingHead(model.config.vision_config.hidden_size)
    before = (head.proj.weight.detach().clone(), bound.proj.weight.detach().clone(),
              head.patch_proj.weight.detach().clone())
    optimizer = make_optimizer(model, PocketTrainConfig(device="cpu"), head, bound)
    answer, reading_loss, binding_loss = _train_step(Trainee(model, head, bound, aligned_ids(stock[1])), optimizer, inputs, 1e-3, reading,
                                                     binding)
    assert answer > 0 and reading_loss > 0 and binding_loss > 0
    assert not torch.equal(before[0], head.proj.weight) and not torch.equal(before[1], bound.proj.weight)
    assert not torch.equal(before[2], head.patch_proj.weight)  # the patches' reading trains too


@pytest.mark.parametrize("binding_weight, binding_moves_the_vlm", [(1.0, True), (0.0, False)])
def test_binding_weight_zero_takes_the_binding_labels_out_of_the_vlms_gradient(stock, binding_weight,
                                                                                binding_moves_the_vlm):
    """The same-run ablation of the binding head (--binding-weight 0): the VLM's gradient is the same whatever the
    binding labels say (here: drawn, or all ignored); at weight 1 the labels change it."""
    import copy

    from arr_coc.pocket.binding import BindingHead, aligned_ids, binding_targets
    from arr_coc.pocket.trainer import Trainee, backward
    from arr_coc.runtime import distributed

    inputs, reading = _batch(stock)
    pages = [make_page(kind, 5, 224, 168) for kind in ("fine_print", "box_word")]
    drawn = torch.from_numpy(__import__("numpy").concatenate([binding_targets(p.marks, 224, 168) for p in pages]))
    grads = []
    for labels in (drawn, torch.full_like(drawn, IGNORE)):
        model = copy.deepcopy(stock[0]).train()
        torch.manual_seed(0)
        heads = ReadingHead(256, 256), BindingHead(256)
        trainee = Trainee(model, *heads, aligned_ids(stock[1]), binding_weight=binding_weight)
        backward(trainee, inputs, reading, labels, distributed.Process(0, 1, "cpu"))
        grads.append(model.model.visual.merger.mlp[2].weight.grad.clone())  # the last layer of the visual tokens
    assert (not torch.allclose(*grads, rtol=0, atol=1e-9)) == binding_moves_the_vlm


def test_the_heads_are_saved_and_resumed(tmp_path):
    from safetensors.torch import load_file

    from arr_coc.pocket.trainer import BINDING_FILE

    cfg = PocketTrainConfig(out=str(tmp_path), steps=1, minutes=5, image_tokens=64, workers=0, eval_every=1000,
                      eval_pages=1, eval_sizes=(224,), device="cpu", warmup=1)
    train(cfg, resume=False)
    for name, index in ((HEAD_FILE, 1), (BINDING_FILE, 4)):
        saved = load_file(tmp_path / name)
        resumed = load_or_init(tmp_path, True, torch.device("cpu"))[index]
        assert all(torch.equal(saved[k], v) for k, v in resumed.state_dict().items())
        fresh = load_or_init(tmp_path, False, torch.device("cpu"))[index]
        assert not torch.equal(saved["proj.weight"], fresh.proj.weight)


def test_a_reading_head_saved_before_the_patches_keeps_its_cells_and_starts_the_patches_afresh(tmp_path):
    """A folder whose head names cells only (as shipped until step 47213): resuming from it loads those weights, and
    the patch head it lacks starts from its seeded initialisation."""
    import shutil

    from safetensors.torch import load_file, save_file

    old, out = tmp_path / "old", tmp_path / "run"
    shutil.copytree(POCKET_FOLDER, old)
    out.mkdir()
    saved = {k: v for k, v in load_file(old / HEAD_FILE).items() if not k.startswith(("patch_", "token_patch_"))}
    assert set(saved) == {"proj.weight", "proj.bias"}
    save_file(saved, old / HEAD_FILE)
    head = load_or_init(out, True, torch.device("cpu"), init=old)[1]
    assert torch.equal(head.proj.weight, saved["proj.weight"]) and torch.equal(head.proj.bias, saved["proj.bias"])
    assert head.patch_proj.weight.shape == (PATCH_SLOTS * (len(ALPHABET) + 1), 256)


@pytest.mark.parametrize("ink_weight", [1.0, 3.0])
def test_a_drawn_characters_cell_slot_weighs_ink_weight_in_the_reading_loss(ink_weight):
    """With a silent head every slot's cross-entropy is log(classes); 3 cell slots hold ink (they weigh ink_weight),
    the patches' 2 ink slots and every empty slot weigh 1, and a gestalt token's ignored slots nothing."""
    import math

    head = ReadingHead(8, 4, ink_weight=ink_weight)
    for p in head.parameters():
        torch.nn.init.zeros_(p)
    targets = torch.full((3, SLOTS + 4 * PATCH_SLOTS), NONE)  # [3 cells, 22 slots]
    targets[0, :3] = torch.tensor([5, 6, 7])  # cell 0: three characters
    targets[1, SLOTS:SLOTS + 2] = torch.tensor([8, 9])  # cell 1: two in its first patch's slots only
    targets[2] = IGNORE  # a gestalt view's token
    counted = 2 * (SLOTS + 4 * PATCH_SLOTS)  # 44 slots not ignored
    log_c = math.log(len(ALPHABET) + 1)
    loss = head(torch.randn(3, 8), targets, reduction="sum", patches=torch.randn(12, 4))
    assert loss.item() == pytest.approx(log_c * (counted + 3 * (ink_weight - 1)), rel=1e-5)
    mean = head(torch.randn(3, 8), targets, patches=torch.randn(12, 4))
    assert mean.item() == pytest.approx(log_c * (counted + 3 * (ink_weight - 1)) / counted, rel=1e-5)


@pytest.mark.parametrize("weight", [0.0, 2.0])
def test_the_merged_tokens_name_their_patches_characters_at_token_patch_weight(weight):
    """A silent head's every slot costs log(classes): the merged tokens' naming of their patches adds 16 slots a
    token that is not ignored, at `weight`. A head whose token map names exactly the patch columns pays nothing
    more for them than a head without it."""
    import math

    head = ReadingHead(8, 4, token_patch_weight=weight)
    for p in head.parameters():
        torch.nn.init.zeros_(p)
    targets = torch.full((3, SLOTS + 4 * PATCH_SLOTS), NONE)  # [3 cells, 22 slots]
    targets[0, SLOTS:SLOTS + 2] = torch.tensor([8, 9])  # cell 0: two characters in its first patch
    targets[2] = IGNORE  # a gestalt view's token
    log_c = math.log(len(ALPHABET) + 1)
    loss = head(torch.randn(3, 8), targets, reduction="sum", patches=torch.randn(12, 4))
    assert loss.item() == pytest.approx(log_c * (2 * 22 + weight * 2 * 16), rel=1e-5)
    with torch.no_grad():  # the token map's bias names cell 0's patch columns (16 slots: 8, 9, then empty)
        named = torch.full((4 * PATCH_SLOTS, len(ALPHABET) + 1), -30.0)  # [16, classes]
        named[torch.arange(16), torch.tensor([8, 9] + [NONE] * 14)] = 30.0
        head.token_patch_proj.bias.copy_(named.flatten())
    one = targets[:1]
    named_loss = head(torch.randn(1, 8), one, reduction="sum", patches=torch.randn(4, 4))
    assert named_loss.item() == pytest.approx(log_c * 22, rel=1e-5)


def test_the_runs_reading_weights_reach_its_reading_head(tmp_path, monkeypatch):
    from arr_coc.pocket import trainer as pocket

    seen = []

    def stop_at_the_optimizer(model, cfg, head, binding):  # the heads are built and set by now
        seen.append((head.ink_weight, head.token_patch_weight))
        raise KeyboardInterrupt

    monkeypatch.setattr(pocket, "make_optimizer", stop_at_the_optimizer)
    with pytest.raises(KeyboardInterrupt):
        train(PocketTrainConfig(out=str(tmp_path), device="cpu", workers=0, read_ink_weight=2.5,
                          read_token_patches=1.5), resume=False)
    assert seen == [(2.5, 1.5)]
