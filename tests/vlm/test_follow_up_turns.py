"""
Conversations in the engine (VLM.prompt with a history, VLM.generate with keep, the Decoder's follow-up prefill)
against transformers: a second turn's every step equals one stock forward over the whole conversation, from
pixels where stock can read the images (the image blocks' positions then come from get_rope_index) and from the
same embeddings and positions where it cannot (ARR's sparse saccade block).
"""

import numpy as np
import pytest
import torch
from PIL import Image

from arr_coc.vlm.views import make_views

QUESTION = "What is written on the sign?"
FOLLOW_UP = "And what colour is it?"
FORCED = "It is red, with white letters."  # the second turn's answer, teacher-forced
FIRST = 6  # tokens the first turn generates (min_new_tokens: no EOS, so its last token is not yet read)


def photo(w=300, h=220, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (h, w, 3), dtype=np.uint8))


def small_view(vlm, seed):
    """A small whole view (PIL, whole cells) of a random photo."""
    return make_views(photo(seed=seed), device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels).gestalt


def second_turn_logits(vlm, prompt, n: int) -> torch.Tensor:
    """The follow-up's prefill, then n teacher-forced decode steps of FORCED -> logits [n + 1, V]."""
    forced = vlm.tokenizer(FORCED, add_special_tokens=False)["input_ids"][:n]
    decoder = vlm.decoder
    cap, logits = decoder.start(prompt.embeds, prompt.position_ids, n + 1, prompt.deepstack,
                                history=prompt.history.cache)
    out = [logits[0]]
    for token in forced:
        decoder.states[cap].token.fill_(token)  # teacher forcing: the step reads the token it is given
        out.append(decoder._decode_step(cap)[1][0].clone())
    return torch.stack(out), forced


def test_the_follow_up_turn_is_the_chat_templates_next_user_turn(family):
    """After an answer cut short, its last token, then the end of turn; after an EOS, the template's end of turn
    alone (the EOS was never read); no system prompt. Written out as the Qwen chat templates render it."""
    vlm = family.vlm
    turn = "<|im_end|>\n<|im_start|>user\n<|vision_start|>" + "<|image_pad|>" * 2 + \
           "<|vision_end|>Why?<|im_end|>\n<|im_start|>assistant\n"
    word = vlm.tokenizer("Hello", add_special_tokens=False)["input_ids"][0]
    assert vlm.tokenizer.decode(vlm.chat.prompt_ids("Why?", [2], follows=word)[0]) == vlm.tokenizer.decode([word]) + turn
    for eos in vlm.eos_token_ids:
        assert vlm.tokenizer.decode(vlm.chat.prompt_ids("Why?", [2], follows=eos)[0]) == turn


def test_a_second_turn_with_a_new_image_equals_stock_over_the_whole_conversation(family):
    """
    Turn 1 (an image and a question, FIRST generated tokens, kept), turn 2 (a second image and a question,
    FORCED teacher-forced on the kept cache): every step's logits equal transformers' forward from pixels over
    the whole conversation, whose text is the stock chat template's rendering of it. Wrong positions after the
    first answer, a wrong restored cache or a wrong follow-up mask all fail here.
    """
    vlm = family.vlm
    views = [small_view(vlm, 1), small_view(vlm, 2)]
    with torch.no_grad():
        first_prompt = vlm.prompt(QUESTION, [vlm.encode_view(views[0])])
        first = vlm.generate(first_prompt, FIRST, min_new_tokens=FIRST, keep=True)
        prompt = vlm.prompt(FOLLOW_UP, [vlm.encode_view(views[1])], history=first.history)
        ours, forced = second_turn_logits(vlm, prompt, 8)
        ids = torch.cat([first.history.ids, prompt.ids, torch.tensor([forced], device=vlm.device)], dim=1)
        stock_in = vlm.image_processor(images=views, return_tensors="pt")
        stock = vlm.model(input_ids=ids, pixel_values=stock_in["pixel_values"].to(vlm.device),
                          image_grid_thw=stock_in["image_grid_thw"].to(vlm.device),
                          mm_token_type_ids=(ids == vlm.image_token_id).int()).logits[0].float()  # [L, V]
    # the conversation is the stock template's, its first answer as generated
    answer = vlm.tokenizer.decode(first.ids[0])
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
                {"role": "assistant", "content": answer},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": FOLLOW_UP}]}]
    text = vlm.tokenizer.apply_chat_template(messages, chat_template=vlm.chat_template, tokenize=False,
                                             add_generation_prompt=True)
    collapsed = [t for i, t in enumerate(ids[0, :-len(forced)].tolist())
                 if t != vlm.image_token_id or ids[0, i - 1] != vlm.image_token_id]  # one pad per image, as text
    assert vlm.tokenizer.decode(collapsed) == text
    # turn 1: each generated token's probability is stock's softmax at its place
    L1 = first_prompt.length
    torch.testing.assert_close(first.probs.cpu(), stock[L1 - 1:L1 - 1 + FIRST].softmax(-1).gather(
        1, first.ids[0, :, None])[:, 0].cpu(), rtol=1e-4, atol=1e-6)
    # turn 2: the prefill's last logits, then each forced step's
    start = first.history.length + prompt.length - 1
    torch.testing.assert_close(ours, stock[start:start + len(forced) + 1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["tiny", "tiny-qwen2.5-vl"])
def test_a_second_turn_of_sparse_saccades_equals_one_forward_with_the_same_embeddings_and_positions(name):
    """
    ARR's turn 2: a block of scattered cells of a large view at their true places, after turn 1's gestalt. Every
    step equals stock's forward over the whole conversation's embeddings and positions (stock cannot lay out
    a sparse block itself), and the block's positions are written out: its cells at (s, s + row, s + col), s the
    place after the answer's last token and the turn's opening text.
    """
    from conftest import tiny_arr_model

    vlm = tiny_arr_model(name).vlm
    views = make_views(photo(700, 500, seed=3), device=vlm.device, cell=vlm.cell, min_pixels=vlm.min_pixels)
    cells = torch.tensor([[9, 2], [0, 24], [17, 11], [3, 3]])
    with torch.no_grad():
        gestalt = vlm.encode_view(views.tensor("gestalt"))
        first_prompt = vlm.prompt(QUESTION, [gestalt])
        first = vlm.generate(first_prompt, FIRST, min_new_tokens=FIRST, keep=True)
        saccades = vlm.encode_cells(views.tensor("highres"), cells)
        prompt = vlm.prompt(FOLLOW_UP, [saccades], history=first.history)
        ours, forced = second_turn_logits(vlm, prompt, 8)
        forced_ids = torch.tensor([forced], device=vlm.device)
        embed = vlm.model.get_input_embeddings()
        # turn 1's prompt and answer (its last token opens turn 2), turn 2, the forced answer
        embeds = torch.cat([first_prompt.embeds, embed(first.ids[:, :-1]), prompt.embeds, embed(forced_ids)], dim=1)
        text_after = first_prompt.position_ids.max() + 1 + torch.arange(FIRST)  # the answer's tokens, turn 1
        before = int((prompt.ids[0] == vlm.image_token_id).nonzero()[0, 0])  # the turn's text before its block
        s = int(text_after[-1]) + before
        expected_block = torch.stack([torch.full((4,), s), s + cells[:, 0], s + cells[:, 1]])  # [3, 4]
        assert torch.equal(prompt.position_ids[:, 0, before:before + 4].cpu(), expected_block)
        assert int(prompt.position_ids[0, 0, 0]) == int(text_after[-1])  # the answer's last token, read now
        tail = prompt.position_ids[:, :, -1:] + 1 + torch.arange(len(forced), device=vlm.device)
        answer = text_after[:-1].view(1, 1, -1).expand(3, 1, -1).to(vlm.device)
        positions = torch.cat([first_prompt.position_ids, answer, prompt.position_ids, tail], dim=2)
        stock = vlm.model(inputs_embeds=embeds, position_ids=positions).logits[0].float()  # [L, V]
    start = first_prompt.length + FIRST - 1 + prompt.length - 1
    torch.testing.assert_close(ours, stock[start:start + len(forced) + 1], atol=1e-4, rtol=1e-4)


def test_fastv_and_the_hf_engine_cannot_hold_a_conversation(arr_model):
    vlm = arr_model.vlm
    with torch.no_grad():
        prompt = vlm.prompt(QUESTION, [vlm.encode_view(small_view(vlm, 1))])
        with pytest.raises(ValueError, match="FastV"):
            vlm.generate(prompt, 2, prune=(1, 4), keep=True)
        vlm.engine = "hf"
        try:
            with pytest.raises(ValueError, match="fast engine"):
                vlm.generate(prompt, 2, keep=True)
        finally:
            vlm.engine = "fast"
