"""
Conversations: one image asked several questions in a row by one pipeline, each turn continuing the LLM's context
of the turns before it. The static cache's keys and values are kept between turns, so a turn prefills only its
own tokens (arr_coc.vlm.decoder).

- ARR reads each question anew (arr.follow_up): the gestalt, its tokens and the texture array come from turn 1;
  the prior pass and the scorers run on the new question, and its cells join the conversation as a new image
  block at their true places, before the question. With ARR's Options.fresh_cells a turn reads only cells no earlier
  turn read.
- Every other pipeline reads its image once, in turn 1; later turns add the question alone, as the stock chat
  template builds a conversation (steps.follow_up). FastV cannot hold one: its layers' caches differ in length.

    chat = Conversation("arr", image)              # parts: arr_coc.pipelines.request.Parts; views: steps.views_of
    first = finished(chat.ask(parts, views_of(parts, image), "What is the value of KEY?", Request()))
    second = finished(chat.ask(parts, None, "What colour is the box around HAMMER?", Request(options=(Options(fresh_cells=True),))))
    second.turn, second.prefilled, second.context, chat.moves()[-1].new   # Options: ARR's (arr_options)
"""

from contextlib import closing
from dataclasses import dataclass, field, replace

import torch

from arr_coc import pipelines
from arr_coc.errors import InputError
from arr_coc.pipelines.answer import Answer
from arr_coc.pipelines.arr_scene import Observation
from arr_coc.pipelines.arr_options import arr_options
from arr_coc.pipelines.request import Parts, Request
from arr_coc.pipelines.steps import follow_up
from arr_coc.vlm.views import Views


@dataclass
class Moves:
    """How ARR's saccades moved from one turn to the next, as (row, col) cells of the candidate grid."""
    new: list[tuple[int, int]]  # read in this turn, not in the one before
    kept: list[tuple[int, int]]  # read in both
    dropped: list[tuple[int, int]]  # read in the turn before, not in this one


def moves(before: Answer, after: Answer) -> Moves:
    """The cells of `after`'s saccades against `before`'s (raster order)."""
    a, b = ({(s.row, s.col) for s in answer.saccades} for answer in (before, after))
    return Moves(sorted(b - a), sorted(a & b), sorted(a - b))


@dataclass
class Conversation:
    """One image, one pipeline, and the answers of its turns so far (the last one holds the LLM's context)."""
    pipeline: str  # a name in arr_coc.pipelines.PIPELINES
    image: object  # the image every turn is about (PIL, a path or an array): its views are made for turn 1
    answers: list[Answer] = field(default_factory=list)  # one per turn, in order; Answer.turn is 1, 2, ...

    def __post_init__(self):
        if self.pipeline in pipelines.FAST_ENGINE_ONLY:
            raise InputError(f"{self.pipeline} cannot hold a conversation: its pruned layers keep caches of "
                             "different lengths; ask its questions one at a time")

    @property
    def read(self) -> torch.Tensor | None:
        """ARR: [GH, GW] bool, the candidate cells any turn so far read (None before the first ARR turn, or after one
        that read the whole native view: Answer.reads_native)."""
        if not self.answers or self.pipeline != "arr" or self.answers[0].reads_native is not None:
            return None
        cells = torch.zeros(self.answers[0].views.candidate_grid, dtype=torch.bool)
        for answer in self.answers:
            for s in answer.saccades:
                cells[s.row, s.col] = True
        return cells.to(self.answers[-1].observation.highres.device)

    def ask(self, parts: Parts, views: Views | None, question: str, request: Request):
        """The next turn: the pipeline's answer to `question` after the turns so far (turn 1: the image's first, read
        from `views`, its views; later turns read none): its tokens as they come, then its Answer."""
        if parts.vlm.engine != "fast":
            raise InputError("conversations run on the fast engine (it keeps the earlier turns' keys and values); "
                             "the hf engine answers one question at a time")
        module = pipelines.load(self.pipeline)
        if not self.answers:
            steps = pipelines.answer_of(self.pipeline)(parts, views, question, replace(request, converse=True))
        elif arr_options(request).refixate is not None:
            raise InputError("refixation (a second look) runs on a conversation's first turn only")
        elif hasattr(module, "follow_up"):  # ARR: reads each question anew
            steps = module.follow_up(parts, self.answers[-1], question, request, self.read)
        else:
            steps = follow_up(parts, self.pipeline, self.answers[-1], question, request)
        with closing(steps):  # closed early (Stop): the turn's steps too, at once
            for answer in steps:
                if not isinstance(answer, Answer):
                    yield answer
        answer.turn = len(self.answers) + 1
        if self.answers:  # only the last turn's context is continued: the earlier caches go
            self.answers[-1].history = None
        self.answers.append(answer)
        yield answer

    def to(self, device) -> "Conversation":
        """
        Move what the next turn reads (the last answer's context and ARR's observation) to `device`, and drop the
        earlier turns' device data (their maps and observations; their text, counts and saccades stay): the app
        keeps a conversation on the CPU between requests, where ZeroGPU's workers cannot hold GPU memory.
        """
        for answer in self.answers:
            answer.arr, answer.fixations, answer.kept, answer.merged = None, [], None, None
            if answer is not self.answers[-1]:
                answer.observation = None
        if self.answers:
            last = self.answers[-1]
            last.observation = None if last.observation is None else observation_to(last.observation, device)
            last.history = None if last.history is None else last.history.to(device)
        return self

    def moves(self) -> list[Moves]:
        """ARR: for each turn after the first, how its saccades moved from the turn before."""
        return [moves(a, b) for a, b in zip(self.answers, self.answers[1:])]


def observation_to(o: Observation, device) -> Observation:
    """An observation with its tensors on `device` (the views are pictures; the gestalt's places stay on the CPU)."""
    gestalt = replace(o.gestalt, features=o.gestalt.features.to(device),
                      deepstack=None if o.gestalt.deepstack is None else o.gestalt.deepstack.to(device))
    states = {name: None if getattr(o, name) is None else getattr(o, name).to(device)
              for name in ("gestalt_states", "question_states")}
    return replace(o, gestalt=gestalt, question_embeds=o.question_embeds.to(device), prior=o.prior.to(device),
                   highres=o.highres.to(device), textures=o.textures.to(device), **states)

