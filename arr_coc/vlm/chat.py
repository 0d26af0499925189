"""
The prompt layout of the Qwen-VL families: chat-template ids with each image block's pads expanded (a first turn,
or a conversation's next user turn), the question as plain user text, token embeddings with the image features in
place of the pads, M-RoPE position ids with each block at its cells' true places (positions.py), and Qwen3-VL's
DeepStack features laid out over the sequence. The Qwen2-VL chat template (Qwen2.5-VL ships the same) is here.

    chat = ChatLayout(tokenizer, CHAT_TEMPLATE, image_token_id, eos_token_ids, embeddings, device=lambda: dev)
    prompt = chat.prompt("What is here?", [gestalt, saccades])        # Prompt: ids, embeds, M-RoPE ids, DeepStack
    ids = chat.prompt_ids("Why?", [256], follows=last_token)           # [1, L] a follow-up turn's ids
"""

from functools import lru_cache
from typing import Callable

import torch

from arr_coc.vlm.base import History, Prompt, VisualTokens
from arr_coc.vlm.positions import ImageBlock, mrope_position_ids

QUESTION_SLOT = "\x00question\x00"  # stands in for the question while the chat template is rendered
ANSWER_SLOT = "\x00answer\x00"  # stands in for an earlier answer while a follow-up turn's template is rendered
END_OF_TURN = "<|im_end|>"  # closes a teacher-forced answer, as the model closes its own
TEXTS_KEPT = 256  # texts whose ids question_ids keeps (a request asks for its question's 5-8 times on the way down)

# The Qwen2-VL chat template (as on the hub's Qwen2-VL-*-Instruct repos); Qwen2.5-VL's repos ship the same one.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatLayout:
    """How a family's prompts are laid out: its tokenizer and chat template, its image pad, its embeddings."""

    def __init__(self, tokenizer, chat_template: str, image_token_id: int, eos_token_ids: list[int],
                 embeddings: torch.nn.Module, device: Callable[[], torch.device]):
        self.tokenizer = tokenizer  # the family's tokenizer
        self.chat_template = chat_template  # the folder's own template, or the family's
        self.image_token_id = image_token_id  # the pad an image block's tokens stand on
        self.eos_token_ids = eos_token_ids  # the ends of an answer (a follow-up turn reads none of them)
        self.embeddings = embeddings  # the LLM's token embedding table
        self.device = device  # where prompts are built (the model's device, read at each call)
        self._ids = lru_cache(maxsize=TEXTS_KEPT)(self._tokenized)  # text -> its ids; lru_cache locks its own state

    def prompt_ids(self, question: str, block_sizes: list[int], follows: int | None = None) -> torch.Tensor:
        """
        Chat-template ids for len(block_sizes) images then the question, each image pad expanded -> [1, L].
        The question is user text: special tokens typed in it stay plain characters (no injected turns or pads).
        follows: the user turn after an answer whose last token this is (not yet read), as the template renders a
        conversation: that token unless it is an EOS (the template's end of turn closes the answer), the end of
        turn, then the user turn (no system prompt: it began the conversation).
        """
        content = [{"type": "image"} for _ in block_sizes] + [{"type": "text", "text": QUESTION_SLOT}]
        messages = [{"role": "user", "content": content}]
        if follows is not None:
            messages = [{"role": "user", "content": "?"}, {"role": "assistant", "content": ANSWER_SLOT}] + messages
        text = self.tokenizer.apply_chat_template(messages, chat_template=self.chat_template, tokenize=False,
                                                  add_generation_prompt=True)
        if follows is not None:
            text = text.split(ANSWER_SLOT)[1]  # from the end of the answer's turn
        before, after = text.split(QUESTION_SLOT)
        ids = [] if follows is None or follows in self.eos_token_ids else [follows]
        ids += self.tokenizer(before, add_special_tokens=False)["input_ids"]
        ids += self.question_ids(question)
        ids += self.tokenizer(after, add_special_tokens=False)["input_ids"]
        out, sizes = [], iter(block_sizes)
        for t in ids:
            out.extend([t] * next(sizes) if t == self.image_token_id else [t])
        return torch.tensor([out], device=self.device())

    def question_ids(self, question: str) -> list[int]:
        """A user text's ids, special tokens typed in it as plain characters. Tokenized once per text: a request's
        checks, its prior pass, the participatory scorer's query and each pipeline's prompt all ask for them (keyed
        by the plain text: lru_cache keys a str subclass, the façade's checked Question, apart from its text)."""
        return list(self._ids(str(question)))

    def _tokenized(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def question_embeds(self, question: str) -> torch.Tensor:
        """The question's own token embeddings [1, Lq, D] (the participatory scorer's query)."""
        ids = torch.tensor([self.question_ids(question)], device=self.device())
        return self.embeddings(ids)

    def position_ids(self, input_ids: torch.Tensor, blocks: list[ImageBlock]) -> torch.Tensor:
        """[1, L] ids -> [3, 1, L] M-RoPE ids, each image block at its cells' true places (get_rope_index's layout)."""
        return mrope_position_ids(input_ids, self.image_token_id, blocks)

    def prompt(self, question: str, images: list[VisualTokens], answer: str | None = None,
               history: History | None = None) -> Prompt:
        """
        The chat prompt for image blocks (each VisualTokens: its features and where they sit) then the question,
        and optionally an answer to teacher-force: ids, embeddings, M-RoPE ids and DeepStack features. Every
        pipeline builds its LLM input here, so no caller lays out a family's internals itself. With a history: a
        conversation's next turn, the new tokens only (prompt_ids' `follows`), their positions after the
        conversation's (each image block at its true places, as get_rope_index lays out a second image).
        """
        ids = self.prompt_ids(question, [len(tokens) for tokens in images], None if history is None else history.last)
        answer_start = ids.shape[1]
        if answer is not None:
            # the answer is user text, as the question is: a special token typed in it stays plain characters
            target = self.question_ids(answer) + self.tokenizer(END_OF_TURN, add_special_tokens=False)["input_ids"]
            ids = torch.cat([ids, torch.tensor([target], device=ids.device)], dim=1)
        embeds = self.embed(ids, [tokens.features for tokens in images])  # [1, L, D]
        position_ids = self.position_ids(ids, [tokens.block for tokens in images])  # [3, 1, L] from 0
        if history is not None:
            position_ids = position_ids + history.cache.position  # the turn goes on where the conversation stands
        return Prompt(ids, embeds, position_ids, answer_start, self.deepstack_layout(ids, images, embeds), history)

    def embed(self, input_ids: torch.Tensor, image_features: list[torch.Tensor]) -> torch.Tensor:
        """Token embeddings with each image block's pads replaced by its features, in order -> [1, L, D]."""
        embeds = self.embeddings(input_ids)  # [1, L, D]
        if image_features:
            features = torch.cat(image_features, dim=0).to(embeds.dtype)  # [n_image_tokens, D]
            mask = (input_ids == self.image_token_id).unsqueeze(-1)
            embeds = embeds.masked_scatter(mask, features)
        return embeds

    def deepstack_layout(self, input_ids: torch.Tensor, images: list[VisualTokens], embeds: torch.Tensor):
        """
        Each image block's DeepStack features at its tokens, zeros elsewhere -> [k, 1, L, D]; None for a family
        without DeepStack or a prompt without images.
        """
        if not images or all(tokens.deepstack is None for tokens in images):
            return None
        if any(tokens.deepstack is None for tokens in images):
            raise ValueError("every image block of a DeepStack model needs its DeepStack features: pass the "
                             "VisualTokens that encode_view/encode_cells returned")
        levels = torch.cat([tokens.deepstack for tokens in images], dim=1).to(embeds.dtype)  # [k, n_image, D]
        mask = (input_ids == self.image_token_id).unsqueeze(-1)  # [1, L, 1]
        return torch.stack([torch.zeros_like(embeds).masked_scatter(mask, level) for level in levels])
