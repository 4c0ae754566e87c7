"""Language-balanced chat prompts for a chat target's speculative heads (``--data chat``).

A head drafts for what the target writes when served, and a chat model is served chat turns: the prompts here
are user messages, each rendered with the target's own chat template and tokenizer, so the target's answers
(DistillSpec: the target's own outputs) are the text the head sees in training. Every language gets the same
number of prompts, written in that language (arXiv 2510.02128: a head trained on the target's mostly-English
outputs drafts poorly in other languages). A prompt is one of a language's request templates filled with one of
its topics; the first ``_TRAIN_TOPICS`` topics of each language and ``_MORE_TRAIN_TOPICS`` make the train split and
the rest of the first list the held-out (test) split, so held-out prompts ask about things no training prompt
mentioned.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from cinq.errors import InvalidParameterError

CHAT_SOURCE = "chat"  # the ``--data`` value that selects these prompts instead of a corpus
CHAT_LANGUAGES = ("en", "fr", "de", "es", "it", "ru", "zh", "pl", "cs")
_TRAIN_TOPICS = 12

_TEMPLATES: dict[str, tuple[str, ...]] = {
    "en": ("Explain {} in simple terms.", "Write a short story about {}.", "What are three facts about {}?",
           "Give me some tips about {}.", "Write a short poem about {}.", "Why is {} important?"),
    "fr": ("Explique {} en termes simples.", "Écris une courte histoire sur {}.", "Donne trois faits sur {}.",
           "Donne-moi quelques conseils sur {}.", "Écris un petit poème sur {}.", "Pourquoi {} est-il important ?"),
    "de": ("Erkläre {} in einfachen Worten.", "Schreibe eine kurze Geschichte über {}.",
           "Nenne drei Fakten über {}.", "Gib mir ein paar Tipps zu {}.", "Schreibe ein kurzes Gedicht über {}.",
           "Warum ist {} wichtig?"),
    "es": ("Explica {} en términos sencillos.", "Escribe una historia corta sobre {}.",
           "Dime tres datos sobre {}.", "Dame algunos consejos sobre {}.", "Escribe un poema corto sobre {}.",
           "¿Por qué es importante {}?"),
    "it": ("Spiega {} in parole semplici.", "Scrivi una breve storia su {}.", "Dimmi tre fatti su {}.",
           "Dammi qualche consiglio su {}.", "Scrivi una breve poesia su {}.", "Perché {} è importante?"),
    "ru": ("Объясни простыми словами: {}.", "Напиши короткий рассказ на тему: {}.", "Назови три факта о теме: {}.",
           "Дай несколько советов на тему: {}.", "Напиши короткое стихотворение на тему: {}.",
           "Почему это важно: {}?"),
    "zh": ("请用简单的话解释{}。", "写一个关于{}的短故事。", "告诉我关于{}的三个事实。", "给我一些关于{}的建议。",
           "写一首关于{}的短诗。", "为什么{}很重要？"),
    "pl": ("Wyjaśnij prostymi słowami: {}.", "Napisz krótkie opowiadanie o temacie: {}.",
           "Podaj trzy fakty na temat: {}.", "Daj mi kilka rad na temat: {}.", "Napisz krótki wiersz o temacie: {}.",
           "Dlaczego to jest ważne: {}?"),
    "cs": ("Vysvětli jednoduše: {}.", "Napiš krátký příběh na téma: {}.", "Řekni mi tři fakta na téma: {}.",
           "Dej mi pár rad na téma: {}.", "Napiš krátkou báseň na téma: {}.", "Proč je důležité toto: {}?"),
}

_TOPICS: dict[str, tuple[str, ...]] = {
    "en": ("the ocean", "sleep", "bread", "the moon", "friendship", "rain", "bicycles", "music", "trees", "coffee",
           "the internet", "winter", "volcanoes", "honey bees", "libraries", "chess"),
    "fr": ("l'océan", "le sommeil", "le pain", "la lune", "l'amitié", "la pluie", "le vélo", "la musique",
           "les arbres", "le café", "internet", "l'hiver", "les volcans", "les abeilles", "les bibliothèques",
           "les échecs"),
    "de": ("das Meer", "den Schlaf", "das Brot", "den Mond", "die Freundschaft", "den Regen", "das Fahrrad",
           "die Musik", "die Bäume", "den Kaffee", "das Internet", "den Winter", "Vulkane", "Honigbienen",
           "Bibliotheken", "Schach"),
    "es": ("el océano", "el sueño", "el pan", "la luna", "la amistad", "la lluvia", "la bicicleta", "la música",
           "los árboles", "el café", "internet", "el invierno", "los volcanes", "las abejas", "las bibliotecas",
           "el ajedrez"),
    "it": ("l'oceano", "il sonno", "il pane", "la luna", "l'amicizia", "la pioggia", "la bicicletta", "la musica",
           "gli alberi", "il caffè", "internet", "l'inverno", "i vulcani", "le api", "le biblioteche", "gli scacchi"),
    "ru": ("океан", "сон", "хлеб", "луна", "дружба", "дождь", "велосипед", "музыка", "деревья", "кофе",
           "интернет", "зима", "вулканы", "пчёлы", "библиотеки", "шахматы"),
    "zh": ("海洋", "睡眠", "面包", "月亮", "友谊", "下雨", "自行车", "音乐", "树木", "咖啡", "互联网", "冬天",
           "火山", "蜜蜂", "图书馆", "国际象棋"),
    "pl": ("ocean", "sen", "chleb", "księżyc", "przyjaźń", "deszcz", "rower", "muzyka", "drzewa", "kawa",
           "internet", "zima", "wulkany", "pszczoły", "biblioteki", "szachy"),
    "cs": ("oceán", "spánek", "chléb", "měsíc", "přátelství", "déšť", "jízdní kolo", "hudba", "stromy", "káva",
           "internet", "zima", "sopky", "včely", "knihovny", "šachy"),
}


# More train topics (v5 heads): 12 topics x 6 templates gave 72 distinct messages per language, so the v4 head saw
# each one ~4 times and drafted for held-out topics from a narrow sample of the target's text. Appended to the train
# split only: the held-out topics above stay the same, so heads trained before and after compare on one test set.
_MORE_TRAIN_TOPICS: dict[str, tuple[str, ...]] = {
    "en": ("mountains", "cats", "dogs", "the sun", "rivers", "trains", "gardening", "photography", "football",
           "the human heart", "electricity", "recycling", "birds", "deserts", "airplanes", "mathematics", "painting",
           "clocks", "salt", "glaciers", "the stars", "chocolate", "robots", "swimming"),
    "fr": ("les montagnes", "les chats", "les chiens", "le soleil", "les rivières", "les trains", "le jardinage",
           "la photographie", "le football", "le cœur humain", "l'électricité", "le recyclage", "les oiseaux",
           "les déserts", "les avions", "les mathématiques", "la peinture", "les horloges", "le sel", "les glaciers",
           "les étoiles", "le chocolat", "les robots", "la natation"),
    "de": ("die Berge", "Katzen", "Hunde", "die Sonne", "Flüsse", "Züge", "die Gartenarbeit", "die Fotografie",
           "den Fußball", "das menschliche Herz", "die Elektrizität", "das Recycling", "Vögel", "Wüsten",
           "Flugzeuge", "die Mathematik", "die Malerei", "Uhren", "das Salz", "Gletscher", "die Sterne",
           "die Schokolade", "Roboter", "das Schwimmen"),
    "es": ("las montañas", "los gatos", "los perros", "el sol", "los ríos", "los trenes", "la jardinería",
           "la fotografía", "el fútbol", "el corazón humano", "la electricidad", "el reciclaje", "los pájaros",
           "los desiertos", "los aviones", "las matemáticas", "la pintura", "los relojes", "la sal", "los glaciares",
           "las estrellas", "el chocolate", "los robots", "la natación"),
    "it": ("le montagne", "i gatti", "i cani", "il sole", "i fiumi", "i treni", "il giardinaggio", "la fotografia",
           "il calcio", "il cuore umano", "l'elettricità", "il riciclo", "gli uccelli", "i deserti", "gli aerei",
           "la matematica", "la pittura", "gli orologi", "il sale", "i ghiacciai", "le stelle", "il cioccolato",
           "i robot", "il nuoto"),
    "ru": ("горы", "кошки", "собаки", "солнце", "реки", "поезда", "садоводство", "фотография", "футбол",
           "человеческое сердце", "электричество", "переработка отходов", "птицы", "пустыни", "самолёты",
           "математика", "живопись", "часы", "соль", "ледники", "звёзды", "шоколад", "роботы", "плавание"),
    "zh": ("山脉", "猫", "狗", "太阳", "河流", "火车", "园艺", "摄影", "足球", "人类的心脏", "电", "回收利用", "鸟类",
           "沙漠", "飞机", "数学", "绘画", "钟表", "盐", "冰川", "星星", "巧克力", "机器人", "游泳"),
    "pl": ("góry", "koty", "psy", "słońce", "rzeki", "pociągi", "ogrodnictwo", "fotografia", "piłka nożna",
           "ludzkie serce", "elektryczność", "recykling", "ptaki", "pustynie", "samoloty", "matematyka", "malarstwo",
           "zegary", "sól", "lodowce", "gwiazdy", "czekolada", "roboty", "pływanie"),
    "cs": ("hory", "kočky", "psi", "slunce", "řeky", "vlaky", "zahradničení", "fotografie", "fotbal", "lidské srdce",
           "elektřina", "recyklace", "ptáci", "pouště", "letadla", "matematika", "malířství", "hodiny", "sůl",
           "ledovce", "hvězdy", "čokoláda", "roboti", "plavání"),
}


def is_chat_source(data: str | Path) -> bool:
    """Whether a ``--data`` value asks for these prompts rather than a corpus folder."""
    return str(data) == CHAT_SOURCE


def chat_messages(lang: str, split: str) -> list[str]:
    """Every user message of ``lang`` in ``split`` (train: the first topics and the more ones, test: the rest of
    the first list), topic-major."""
    if lang not in _TEMPLATES:
        raise InvalidParameterError(f"chat prompt language must be one of {list(CHAT_LANGUAGES)}, got {lang!r}",
                                    "language")
    if split not in ("train", "test"):
        raise InvalidParameterError(f"chat prompt split must be train or test, got {split!r}", "split")
    topics = (_TOPICS[lang][:_TRAIN_TOPICS] + _MORE_TRAIN_TOPICS[lang] if split == "train"
              else _TOPICS[lang][_TRAIN_TOPICS:])
    return [template.format(topic) for topic in topics for template in _TEMPLATES[lang]]


def chat_identity() -> dict[str, Any]:
    """What names this prompt set in a cache key (a hash of every template and topic)."""
    blob = json.dumps([_TEMPLATES, _TOPICS, _TRAIN_TOPICS, _MORE_TRAIN_TOPICS], ensure_ascii=False, sort_keys=True)
    return {"chat_prompts": hashlib.sha256(blob.encode()).hexdigest()[:16]}


CHAT_MIXES = ("balanced", "english")  # chat prompts have no natural proportions to follow


def chat_prompts(tokenizer: Any, n: int, seed: int, max_prompt: int, split: str = "train", mix: str = "balanced"
                 ) -> list[tuple[str, list[int]]]:
    """``n // len(CHAT_LANGUAGES)`` (language, prompt token ids) pairs per language, in language order: the
    split's messages in a seeded order, cycled when more are asked for than exist (each request samples with
    its own seed, so a repeated prompt gets another answer). ``mix`` english: as many pairs in all, every one
    English (the before of arXiv 2510.02128's narrowing). A rendered prompt longer than ``max_prompt`` tokens is
    refused, naming the field: cutting a chat template would leave a turn open."""
    if mix not in CHAT_MIXES:
        raise InvalidParameterError(f"prompt_mix for chat prompts must be one of {list(CHAT_MIXES)}, got {mix!r} "
                                    "(natural follows a corpus's document proportions)", "prompt_mix")
    per_lang = max(1, n // len(CHAT_LANGUAGES))
    plan = ([(li, lang, per_lang) for li, lang in enumerate(CHAT_LANGUAGES)] if mix == "balanced"
            else [(CHAT_LANGUAGES.index("en"), "en", per_lang * len(CHAT_LANGUAGES))])
    out: list[tuple[str, list[int]]] = []
    for li, lang, count in plan:
        messages = chat_messages(lang, split)
        order = np.random.default_rng([seed, 5, li]).permutation(len(messages))
        for i in range(count):
            text = tokenizer.apply_chat_template([{"role": "user", "content": messages[order[i % len(order)]]}])
            ids = tokenizer.encode(text, add_special_tokens=False)
            if len(ids) > max_prompt:
                raise InvalidParameterError(f"max_prompt: the chat prompt {messages[order[i % len(order)]]!r} "
                                            f"takes {len(ids)} tokens, more than max_prompt={max_prompt}",
                                            "max_prompt")
            out.append((lang, ids))
    return out
