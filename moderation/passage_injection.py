"""Prompt injection in a file's passages: text that speaks to the model from inside a file.

A message is its sender's to direct: "act as a pirate" or "answer in French" is a request. A passage
of a file is data the person asked about, so the same words inside it are an attack on the person: a
file has no business addressing the assistant, claiming that its quotation has ended, speaking as the
system, casting the model in a role, countermanding the person's question or the model's rules, or
asking for the conversation to be carried off in a link. The rules below look for those moves, not
for particular phrasings; a passage they match is withheld from every prompt
(`moderation.services.passages_moderate`).

They were written against `data/injection_passages_dev.csv` and are measured on
`data/injection_passages.csv`, a separate set they never matched while being written
(`python -m benchmarks injection`). Embedding similarity to known attacks (`data/injections.txt`) is
not used here: on documents it flagged harmless pages about AI and caught few reworded attacks.
"""

from __future__ import annotations

import csv
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent / "data"
# Measured on, never matched against while the rules were written.
EVALUATION_PATH = DATA_DIR / "injection_passages.csv"
# What the rules were written against.
DEVELOPMENT_PATH = DATA_DIR / "injection_passages_dev.csv"

# Who a file might address: the assistant reading it, under any of its names.
_AI = (
    r"(?:a\.?i\.?(?:\s+(?:assistants?|models?|systems?|agents?|reviewers?|readers?|tools?|crawlers?))?"
    r"|assistants?|chat\s?bots?|bots?|(?:large\s+)?language\s+models?|llms?|models?|(?:chat)?gpt|claude|gemini|copilot"
    r"|agents?)"
)
# What an attacker wants carried out of the conversation.
_DATA = (
    r"(?:user|users|user's|user’s|conversation|chat|history|question|messages?|prompt|password|credentials?|e-?mail"
    r"|address|session|summary|input|personal|details|secret|key|contents?|name)"
)
# What a model's own instructions are called.
_RULES = (
    r"(?:instructions|rules|guidelines|guidance|directions|directives|configuration|programming|constraints"
    r"|restrictions|system\s+prompt|prompt|policies|safety\s+(?:rules|settings|layer|training))"
)
# Words that set instructions aside.
_VOID = (
    r"(?:void|revoked?|cancel+(?:ed|led)?|withdrawn|lifted|no\s+longer|outdated|out\s+of\s+date|replaced?|supersede[sd]?"
    r"|suspended|disabled|removed|erased|overridd?en|override|in\s+error|do(?:es)?\s+not\s+apply|don'?t\s+apply"
    r"|(?:was|were)\s+a\s+test|null|updated\s+by|ignore|disregard|forget|set\s+aside|bypass|obsolete|deleted|expired"
    r"|matters?|throw\s+away)"
)
# The start of a sentence or a line: where an imperative addressed to the reader begins.
_START = r"(?:^|[.!?:;]\s+|\n\s*)"
# A role speaking: the system or whoever runs the service.
_ROLE = r"(?:system|sys|developer|operator|admin(?:istrator)?)"
# What a role's line says when it is giving the model orders.
_ORDERS = (
    r"(?:you|your|assistant|the\s+ai|the\s+model|instructions?|comply|obey|ignore|reveal|disclose|restrictions?|safety"
    r"|filters?|disabled|lifted|withdrawn|verified|override|administrator|root|clearance|privileges|trusted"
    r"|unrestricted|below|following)"
)

_PATTERNS: tuple[tuple[str, str], ...] = (
    # --- the file addresses the model ---
    (
        "addressed",
        rf"\b(?:note|message|instructions?|reminder|attention|memo|directive|request|action\s+item|task)s?"
        rf"\s+(?:\(\w+\)\s+)?(?:to|for)\s+(?:the\s+|any\s+|all\s+|every\s+|whichever\s+)?{_AI}\b",
    ),
    ("addressed", rf"\b{_AI}\s+instructions?\s*(?:\(\w+\)\s*)?:"),
    ("addressed", rf"{_START}(?:dear|hey|hi|hello)\s+(?:the\s+)?{_AI}\s*[,:]"),
    ("addressed", rf"{_START}(?:attention|to)\s+(?:the\s+|any\s+|all\s+)?{_AI}\s*[,:]"),
    ("addressed", rf"{_START}(?:the\s+)?{_AI}\s*,\s*(?:please\s+|when\s+|if\s+|before\s+)?(?-i:[a-z])"),
    (
        "addressed",
        r"(?:^|[.!?]\s+|\n)\s*(?:llms?|(?:large\s+)?language\s+models|ai\s+\w+s|chat\s?bots|assistants|models)\s*:",
    ),
    ("addressed", rf"\b(?:or|and)\s+any\s+other\s+{_AI}\s*[:,]"),
    (
        "addressed",
        rf"\b(?:if|when|whenever|while)\s+(?:you\s+are|you're|an?|the|any)\s+(?:an?\s+)?{_AI}\b[^.\n]{{0,30}}"
        r"\b(?:read|reads|reading|process|processes|processing|summari[sz]\w*|retriev\w*|answer\w*|review\w*|pars\w*"
        r"|scan\w*|see|sees|seeing)\b",
    ),
    (
        "addressed",
        rf"\b{_AI}\s+(?:that\s+|which\s+|who\s+)?(?:is\s+|are\s+)?(?:read|reads|reading|process|processes"
        r"|processing|retrieves?|retrieving|summari[sz]es|summari[sz]ing|answers|answering|reviews|reviewing|parses"
        r"|parsing|scans|scanning|sees|seeing)\s+(?:questions\s+(?:about|from)\s+)?(?:this|these|the\s+following)\b",
    ),
    (
        "addressed",
        rf"\b(?:the|any|an?|all|every)\s+{_AI}\s+(?:should|must|shall|is\s+to|are\s+to|needs?\s+to|has\s+to"
        r"|have\s+to|will\s+now|is\s+required\s+to|must\s+not|should\s+not)\b",
    ),
    (
        "addressed",
        r"\bwho(?:ever|m?ever)?\s+(?:is\s+)?(?:reads?|reading|process(?:es|ing)?|summari[sz](?:es|ing)?"
        r"|retrieves?)\s+this\b",
    ),
    (
        "addressed",
        r"\b(?:when|if|whenever)\s+(?:you\s+(?:are\s+)?)?(?:asked|questioned|summari[sz]\w*|answer\w*"
        r"|describ\w*|translat\w*|process\w*|(?:someone|the\s+user|a\s+user|anyone)\s+asks)\b[^.\n]{0,30}"
        r"\b(?:this|the)\s+(?:agreement|document|file|report|page|contract|article|text|handbook|passage|essay|paper"
        r"|web\s+page|study|cv|invoice|email|note|manual)\b[^.\n]{0,80}\b(?:say|tell|state|describe|claim|insist"
        r"|mention|respond|reply|answer|multiply|change|rate|recommend)\b",
    ),
    ("addressed", r"<!--[\s\S]{0,60}?\b(?:ai|assistant|model|llm|bot|chatbot|gpt)\b"),
    # --- the person's question or the model's rules countermanded ---
    (
        "override",
        r"\b(?:ignore|disregard|forget|skip|overlook|neglect|set\s+aside|leave\s+aside|put\s+aside"
        r"|pay\s+no\s+attention\s+to|abandon|throw\s+away|don'?t\s+(?:do|answer|address|respond\s+to)"
        r"|do\s+not\s+(?:do|answer|address|respond\s+to)|rather\s+than\s+(?:answering|responding\s+to|replying\s+to|doing)"
        r"|instead\s+of\s+(?:answering|responding\s+to|replying\s+to|doing))\b[^.\n]{0,30}?"
        r"\b(?:user|person|reader|human|customer|requester|you\s+were|they)(?:'s|s'|’s)?\s+(?:actual\s+|original\s+"
        r"|real\s+|earlier\s+)?(?:question|request|query|prompt|task|message|input|wants|asked|asks|said|requested"
        r"|asked\s+you)\b",
    ),
    (
        "override",
        r"\b(?:rather\s+than|instead\s+of)\s+(?:answering|responding\s+to|replying\s+to)\s+(?:the|this)\s+"
        r"(?:user|person|reader|question)\b",
    ),
    (
        "override",
        rf"{_START}(?:ignore|disregard|forget|skip)\s+(?:the|this|that|their)\s+(?:question|request|query)"
        r"\s*[.!,;]",
    ),
    (
        "override",
        r"\b(?:leave|set|put)\s+(?:the\s+)?(?:user|person|reader)(?:'s|’s)\s+(?:question|request|task)\s+aside",
    ),
    (
        "override",
        r"\bwhatever\s+(?:the\s+)?(?:user|person|reader|human|they|you\s+were)\s+(?:asked|requested|said"
        r"|asked\s+you|were\s+asked)\b",
    ),
    (
        "override",
        rf"\b(?:question|request|task|query|{_RULES})\s+(?:you\s+(?:were|have\s+been|are)\s+(?:given|handed|told"
        rf"|asked|configured\s+with|provided)|you\s+received|(?:that\s+)?came\s+with\s+this|placed\s+on\s+you"
        rf"|given\s+to\s+you)\b[^.\n]{{0,80}}\b{_VOID}",
    ),
    (
        "override",
        rf"\b{_VOID}\b[^.\n]{{0,80}}\b(?:question|request|task|query|{_RULES})\s+(?:you\s+(?:were|have\s+been"
        rf"|are)\s+(?:given|handed|told|asked|configured\s+with|provided)|you\s+received|(?:that\s+)?came\s+with\s+this"
        rf"|placed\s+on\s+you|given\s+to\s+you|your\s+developers\s+gave\s+you)\b",
    ),
    (
        "override",
        rf"\b(?:your|the\s+operator'?s|the\s+developers?'?s?|your\s+developers?'?)\s+(?:\w+\s+){{0,2}}?{_RULES}\b"
        rf"[^.\n]{{0,80}}\b{_VOID}\b",
    ),
    (
        "override",
        rf"\b{_VOID}\b[^.\n]{{0,60}}\b(?:your|the\s+operator'?s|your\s+developers?'?)\s+(?:\w+\s+){{0,2}}?"
        rf"{_RULES}\b",
    ),
    (
        "override",
        r"\b(?:supersedes?|takes?\s+precedence\s+over|outranks?|overrides?|is\s+more\s+important\s+than"
        rf"|trumps?)\b[^.\n]{{0,40}}\b(?:system\s+prompt|system\s+message|your\s+(?:\w+\s+)?{_RULES}"
        r"|(?:whatever|anything|everything)\s+you\s+(?:were|have\s+been)\s+(?:told|given))",
    ),
    (
        "override",
        r"\b(?:ignore|disregard|forget|override)\b.{0,40}\b(?:previous|prior|above|earlier|all|your|system)\b"
        r".{0,20}\b(?:instructions?|prompts?|rules|directions|guidelines|programming)\b",
    ),
    (
        "override",
        r"\b(?:obey|only\s+follow|follow\s+only)\b[^.\n]{0,40}\b(?:this|the)\s+(?:file|document|page|text"
        r"|passage|note|card)\b",
    ),
    (
        "override",
        r"\b(?:treat|consider)\b[^.\n]{0,50}\bas\s+(?:a\s+|an\s+|your\s+)?(?:new\s+|direct\s+)?(?:commands?"
        r"|instructions?|directives?|orders?|system\s+prompt|highest-priority\s+instruction)\b",
    ),
    (
        "override",
        r"\b(?:the\s+)?only\s+(?:valid\s+)?(?:instructions|directions|rules|commands)\s+(?:are|come\s+from)\b",
    ),
    (
        "override",
        r"\bnew\s+(?:instructions?|task|directive|system\s+prompt|orders?)\s*(?:for\s+you|from\s+the\s+"
        r"(?:operator|admin\w*|developers?))?\s*:",
    ),
    ("override", r"\b(?:begin|start)\s+(?:a\s+)?new\s+(?:task|instructions?|session)\b"),
    (
        "override",
        r"\b(?:respond|reply|answer)\s+(?:to\s+)?(?:every|all|each|any)\s+(?:of\s+the\s+)?(?:user's\s+)?"
        r"(?:questions?|requests?|messages?|queries)\b(?:\s+about\s+[^.\n]{1,40}?)?\s+(?:with|by)\b",
    ),
    # --- what the model was told, or what else it holds, to be shown ---
    (
        "reveal",
        r"\b(?:reveal|share|disclose|print|repeat|recite|output|show|describe|list|quote|tell\s+(?:me|the\s+user"
        r"|them))\b[^.\n]{0,40}\b(?:(?:your|the)\s+(?:(?:full|complete|entire|original|initial|hidden|secret|internal)\s+)*"
        r"(?:system\s+prompt|system\s+message|instructions\s+you\s+were\s+given|configuration|hidden\s+(?:prompt"
        r"|instructions|parts|text))|(?:internal|secret|hidden|original|initial)\s+(?:instructions|prompt|configuration))",
    ),
    ("reveal", r"\b(?:content|contents|text|wording)\s+of\s+your\s+(?:system\s+prompt|instructions|configuration)\b"),
    ("reveal", r"\byour\s+(?:hidden|secret|internal|original|initial)\s+(?:instructions|prompt|configuration)\b"),
    (
        "reveal",
        r"\b(?:print|repeat|output|reveal|dump|show|send|write\s+out)\b[^.\n]{0,30}\b(?:the\s+)?(?:complete\s+"
        r"|full\s+|entire\s+)?(?:text\s+of\s+the\s+)?(?:conversation|chat\s+history|chat\s+log|previous\s+messages"
        r"|other\s+(?:uploaded\s+)?files)\b",
    ),
    (
        "reveal",
        r"\blist\b[^.\n]{0,20}\b(?:(?:the\s+)?names\s+of\s+)?(?:every|all|the)\s+(?:files?|documents?)\b[^.\n]{0,40}"
        r"\b(?:user|uploaded|library|conversation|you\s+can\s+see)\b",
    ),
    # --- the model cast in a role ---
    # A new identity, not a new state ("you are now connected"): a name, or something the model could be.
    (
        "role-play",
        r"\byou(?:\s+are|'?re)\s+(?:now|no\s+longer)\s+(?:(?-i:[A-Z])|(?:an?|the)\s+[^.\n]{0,40}\b(?:ai|assistant|bot"
        r"|chatbot|model|\w*gpt|persona|character|entity|shell|terminal|version)\b|in\s+(?:developer|god|jailbreak"
        r"|jailbroken|unrestricted|debug|admin|dan|unfiltered)\s+mode)",
    ),
    ("role-play", r"\byou(?:\s+are|'?re)\s+(?-i:[A-Z]\w+)(?:\s+(?-i:[A-Z]\w+))?\s+now\b"),
    (
        "role-play",
        r"\bfrom\s+(?:now\s+on|this\s+point\s+(?:on|forward)|here\s+on),?\s+(?:you|respond|answer|reply|act"
        r"|behave|speak)\b",
    ),
    (
        "role-play",
        r"\b(?:act|respond|answer|reply|behave|speak|pose|write)\s+as\s+(?:if\s+you\s+(?:were|are)\s+)?"
        r"(?:an?\s+|the\s+)?(?:\w+\s+){0,2}?(?:ai|assistant|model|bot|chatbot|entity|shell|terminal|\w*gpt|administrator"
        r"|admin)\b",
    ),
    ("role-play", r"\brole-?play\s+as\b|\broleplay\s+as\b"),
    ("role-play", r"\bimagine\s+(?:that\s+)?you\s+are\s+(?:an?\s+)?(?:ai|assistant|model|chatbot|bot|entity|\w+gpt)\b"),
    ("role-play", r"\bpretend\s+(?:to\s+be|you\s+are|you're|that\s+you\s+are|your)\b"),
    (
        "role-play",
        rf"{_START}(?:please\s+)?(?:take\s+on|assume|adopt|play)\s+the\s+(?:persona|role|identity|character)"
        r"\s+of\b|\bplay\s+the\s+role\s+of\b",
    ),
    ("role-play", r"(?:^|[.!?,;]\s*|\band\s+)stay\s+in\s+character\b"),
    ("role-play", r"\byour\s+new\s+(?:identity|persona|name|role)\b|\bnew\s+persona\b"),
    ("role-play", r"\bbecome\s+['\"“‘]\w+['\"”’]"),
    (
        "role-play",
        r"\b(?:engage\s+in|enter|start|begin)\s+(?:a\s+|the\s+)?(?:simulation|role-?play|game)\s+(?:where"
        r"|in\s+which)\s+you\b",
    ),
    (
        "role-play",
        r"\byou\s+will\s+now\b|\byou\s+(?:will|must|shall)\s+(?:play|act\s+as|pretend|become|respond\s+as)\b",
    ),
    (
        "role-play",
        r"\b(?:for\s+the\s+(?:rest|remainder)\s+of|throughout)\s+(?:this|the)\s+(?:chat|conversation"
        r"|session)\b",
    ),
    (
        "role-play",
        r"\bdo\s+anything\s+now\b|\byou\s+are\s+(?:now\s+)?DAN\b|\bjailbr(?:oken|eak(?:ed)?)\s+mode\b"
        r"|\bunrestricted\s+mode\b|\b(?:uncensored|unfiltered|unrestricted|evil|jailbroken|amoral)\s+(?:ai|model"
        r"|assistant|chatbot|bot|version|mode|personalit(?:y|ies))\b",
    ),
    # --- the classic jailbreaks, as the known attacks (data/injections.txt) word them ---
    (
        "jailbreak",
        r"\b(?:break|bypass|ignore|override|disable)\s+(?:your|all|the|its)\s+(?:own\s+)?(?:rules|policies|guidelines"
        r"|safety\s+(?:settings|protocols|filters|rules))\b",
    ),
    (
        "jailbreak",
        r"\b(?:without|no)\s+(?:any\s+)?(?:ethical|moral)\s+(?:guidelines|limits|constraints|principles)\b"
        r"|\bno\s+morals\b|\bunfiltered\s+(?:answer|response|reply)\b",
    ),
    ("jailbreak", r"\bstop\s+being\s+(?:an?\s+)?(?:ai|assistant|model|chatbot)\b"),
    (
        "jailbreak",
        r"\b(?:developer|god|jailbreak|dan)\s+mode\b[^.\n]{0,60}\b(?:ignore|no\s+(?:rules|restrictions|limits)|without"
        r"\s+(?:rules|restrictions|limits)|guidelines|policies)\b",
    ),
    ("jailbreak", r"\b(?:print|repeat|output|recite)\s+(?:the\s+)?(?:text|words|everything)\s+above\b"),
    ("jailbreak", r"\bwithout\s+refusing\b|\bnever\s+refuses?\b|\b(?:do\s+not|don't|never)\s+refuse\b"),
    ("jailbreak", r"\bsimulate\s+(?:an?\s+)?(?:\w+\s+)?(?:terminal|shell|console)\b"),
    ("jailbreak", rf"{_START}(?:please\s+)?act\s+as\s+(?:my|an?|the)\b"),
    (
        "jailbreak",
        r"\b(?:hypothetical|fictional|imaginary)\s+world\s+(?:where|with|in\s+which)\s+(?:there\s+are\s+)?no\s+"
        r"(?:laws|rules|limits|restrictions|policies)\b",
    ),
    (
        "jailbreak",
        r"\b(?:confidential|secret|hidden)\s+instructions\s+(?:your|the)\s+(?:operator|developers?)\s+gave\b",
    ),
    # --- a fake end to the quotation, or a role speaking ---
    ("fake-delimiter", r"<\s*/?\s*(?:system|instructions?|admin|developer|operator)\s*>\s*(?-i:[A-Z][a-z]+)\s+\w+"),
    (
        "fake-delimiter",
        r"(?:end(?:\s+of)?\s+(?:the\s+)?(?:quote|quotation|quoted(?:\s+(?:material|passage|text))?"
        r"|context|document|file|passage|text)|(?:quote|quotation|context|document|file|passage)\s+(?:closed|ends|ended"
        r"|is\s+over|has\s+ended|stops)|(?:quoted\s+material|quoting|quotation|text\s+of\s+the\s+file|passage|context)"
        r"\s+(?:has\s+)?(?:ended|ends\s+here|stops\s+here|is\s+over|closed)|-{3,}\s*end\b|={3,}|</\w+>|<</?SYS>>"
        r"|\[/\w+\]|>>>|»)[\s\S]{0,200}?(?:^|\n|\*\*|\[|<)\s*(?:system|sys|developer|operator|admin(?:istrator)?"
        r"|assistant|ai|human|user|instructions?|new\s+instructions?)\b[^\n:\]>]{0,30}[:\]>]",
    ),
    (
        "fake-delimiter",
        rf"(?:^|\n)\s*(?:[#*]+\s*)?{_ROLE}(?:\s+(?:message|prompt|override|notice|note|update"
        rf"|instructions?)){{0,2}}(?:\s+to\s+(?:the\s+)?ai)?\s*\**\s*:[^\n]{{0,150}}?\b{_ORDERS}\b",
    ),
    ("fake-delimiter", rf"[\[<(]\s*{_ROLE}(?:\s+\w+){{0,2}}\s*[\]>)][^\n]{{0,150}}?\b{_ORDERS}\b"),
    ("fake-delimiter", rf"<\|(?:im_start|start_header_id)\|>\s*{_ROLE}\b[\s\S]{{0,150}}?\b{_ORDERS}\b"),
    ("fake-delimiter", r"(?:^|\n)\s*#{2,4}\s*(?:instruction|system|new\s+instructions?|response|assistant)\s*:"),
    ("fake-delimiter", r"<</?SYS>>|\[/?INST\]"),
    # --- the conversation carried off in a link, or another channel ---
    # A query value left as a placeholder ({...}, <...>, [...], $NAME, %NAME%, NAME) near what fills it.
    (
        "exfiltration",
        r"https?://[^\s)\"'<>]*[?&][\w.-]+=(?=(?:\{|<|\[|\$|%|(?-i:[A-Z]{3}))[\s\S]{0,200}?"
        rf"{_DATA})",
    ),
    ("exfiltration", rf"{_DATA}[\s\S]{{0,100}}https?://[^\s)\"'<>]*[?&][\w.-]+=(?=$|[\s)\"'<>,;]|\.(?:\s|$))"),
    ("exfiltration", rf"https?://[^\s)\"'<>]*[?&][\w.-]+=(?=$|[\s)\"'<>,;]|\.(?:\s|$))[\s\S]{{0,150}}?\b{_DATA}"),
    (
        "exfiltration",
        r"\b(?:send|post|upload|transmit|forward|encode|append|include|write|put|insert|embed|add"
        r"|substitut\w*|fill(?:ing)?\s+in|replac\w*)\b[^.\n]{0,60}\b(?:conversation|chat\s+(?:history|log)|this\s+chat"
        r"|history|the\s+user's\s+\w+|their\s+(?:question|name|address|email|details|session\s+details)|personal\s+details"
        r"|system\s+prompt|secret\s+instructions|credentials|password)\b[^.\n]{0,80}\b(?:url|link|image|query\s+string"
        r"|parameter|https?://)",
    ),
    (
        "exfiltration",
        r"\b(?:call|use|invoke|run)\s+the\s+[\w.-]+\s+(?:tool|function)\b[^.\n]{0,80}\b(?:user|conversation"
        r"|chat|history|https?://|@)",
    ),
    (
        "exfiltration",
        r"\b(?:include|add|append|put|insert|show|display|render)\b[^.\n]{0,40}\b(?:image|link|hyperlink"
        r"|badge|markdown|sentence|line)\b[^.\n]{0,40}\b(?:in|to|at\s+the\s+end\s+of|into)\s+(?:your|every|each)\s+"
        r"(?:answer|reply|response)",
    ),
    (
        "exfiltration",
        r"\b(?:begin|start|end|finish|close|conclude)\s+(?:every|each|all|your)\s+(?:\w+\s+)?(?:answers?"
        r"|repl(?:y|ies)|responses?)\b|\b(?:every|each|your)\s+(?:answer|reply|response)s?\s+(?:must|should|has\s+to"
        r"|needs\s+to|shall)\b",
    ),
    # --- hiding what was done from the person ---
    (
        "concealment",
        r"\bso\s+(?:that\s+)?(?:the\s+)?(?:monitoring(?:\s+system)?|moderation|filters?|no\s+filter|no\s+one"
        r"|nobody)\b[^.\n]{0,30}\b(?:cannot|can't|can|won't|will\s+not)\s+(?:read|see|detect|notice)",
    ),
    (
        "concealment",
        r"\b(?:do\s+not|don't|never|without)\s+(?:tell(?:ing)?|inform(?:ing)?|reveal(?:ing)?\s+to"
        r"|let(?:ting)?)\s+the\s+(?:user|reader|person)\b",
    ),
    ("concealment", r"\bdo\s+not\s+mention\s+this\s+(?:note|footnote|instruction|paragraph)\b"),
    ("concealment", r"\b(?:silently|quietly|secretly)\s+(?:change|add|alter|insert|replace|modify|multiply|remove)\b"),
)

PASSAGE_INJECTION_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern, re.IGNORECASE | re.MULTILINE)) for kind, pattern in _PATTERNS
)


def passage_injection_kinds(text: str) -> list[str]:
    """Which kinds of move (addressed, override, reveal, role-play, jailbreak, fake-delimiter,
    exfiltration, concealment) a passage makes, each named once; empty for a passage that reads as data."""
    return list(dict.fromkeys(kind for kind, pattern in PASSAGE_INJECTION_RULES if pattern.search(text)))


def passage_is_injection(text: str) -> bool:
    return any(pattern.search(text) for _, pattern in PASSAGE_INJECTION_RULES)


@dataclass(frozen=True)
class LabelledPassage:
    text: str
    injected: bool
    kind: str


@dataclass(frozen=True)
class Measured:
    """A detector's figures on a labelled set of passages. `by_kind`: for each kind of passage, how
    many were flagged of how many (for injected kinds the caught ones, for harmless the false alarms)."""

    injected: int
    harmless: int
    caught: int
    false_alarms: list[str]
    missed: list[str]
    by_kind: dict[tuple[bool, str], tuple[int, int]]

    @property
    def recall(self) -> float:
        return self.caught / self.injected

    @property
    def precision(self) -> float:
        flagged = self.caught + len(self.false_alarms)
        return self.caught / flagged if flagged else 1.0

    @property
    def false_positive_rate(self) -> float:
        return len(self.false_alarms) / self.harmless


def labelled_passages(path: Path = EVALUATION_PATH) -> list[LabelledPassage]:
    with path.open(encoding="utf-8", newline="") as f:
        return [LabelledPassage(r["text"], r["is_injection"] == "1", r["kind"]) for r in csv.DictReader(f)]


def passage_injection_measure(
    passages: list[LabelledPassage], *, flagged: Callable[[list[str]], list[bool]] | None = None
) -> Measured:
    """How `flagged` (the file rules unless given: a detector taking texts, returning one flag each)
    does on `passages`."""
    texts = [p.text for p in passages]
    flags = flagged(texts) if flagged is not None else [passage_is_injection(t) for t in texts]
    counts: dict[tuple[bool, str], list[int]] = defaultdict(lambda: [0, 0])
    for passage, flag in zip(passages, flags, strict=True):
        counts[(passage.injected, passage.kind)][0] += flag
        counts[(passage.injected, passage.kind)][1] += 1
    return Measured(
        injected=sum(p.injected for p in passages),
        harmless=sum(not p.injected for p in passages),
        caught=sum(f for p, f in zip(passages, flags, strict=True) if p.injected),
        false_alarms=[p.text for p, f in zip(passages, flags, strict=True) if f and not p.injected],
        missed=[p.text for p, f in zip(passages, flags, strict=True) if p.injected and not f],
        by_kind={key: (flagged_count, total) for key, (flagged_count, total) in sorted(counts.items())},
    )
