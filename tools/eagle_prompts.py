"""Chat prompts for training an EAGLE-style draft head (tools/train_eagle.py), composed offline, with a held-out
split by template *and* topic.

    train, held = split_prompts(n_train=6000, n_held=96, seed=0)

A prompt is a template of one kind (a task about an activity, a concept or a story subject) filled with a topic of
that kind, optionally with a style prefix (who asks, how) and a style suffix (length, form). Templates and topics are
each split in two: every fifth template of each kind and every fifth topic of each kind are held out, and a
held-out prompt uses only held-out templates and held-out topics, so no held-out prompt shares its template or its
topic with a training prompt (held-out α measures generalisation, not memorisation). The held-out templates include
the style of `benchmarks/speculative.py`'s three chat prompts (tips, explaining to a beginner, a short story); those
three prompts themselves, and their topics, are never produced.
"""
from __future__ import annotations

import random

# The benchmark's chat prompts (benchmarks/speculative.py's CHAT): never produced, their topics never used.
BENCHMARK_CHAT = (
    "What are three tips for staying healthy?",
    "Explain what a hash table is to a beginner.",
    "Write a short story about a robot who learns to paint.",
)
EXCLUDED_TOPICS = {"staying healthy", "a hash table", "a robot who learns to paint"}

# kind -> templates ("{}" is the topic). Index 0 of each kind (held out: i % 5 == 0) is the benchmark's style.
TEMPLATES = {
    "activity": [
        "What are three tips for {}?", "Give me some advice on {}.", "How do I get started with {}?",
        "What are common mistakes people make when {}?", "What are five tips for {}?",
        "What equipment do I need for {}?", "I want to improve at {}. Where should I begin?",
        "Make a one-week plan for {}.", "What are the benefits of {}?", "How can I stay motivated when {}?",
        "Share a few tips for {}.", "What should a beginner know about {}?", "Is {} hard to learn?",
        "How much time should I spend on {} each week?", "What are the most important skills for {}?",
        "Write a checklist for {}.", "What are some fun ways to practice {}?", "How do experts approach {}?",
        "Give me three tips for {}, please.", "Can you help me with {}? I am a complete beginner.",
        "What is the best way to learn {}?", "List the steps involved in {}.",
        "Write a short guide to {}.", "What do people usually get wrong about {}?",
        "Suggest a daily routine for {}.",
    ],
    "concept": [
        "Explain what {} is to a beginner.", "What is {}?", "Explain {} in simple terms.",
        "Give me a list of five facts about {}.", "What is the history of {}?", "Why is {} important?",
        "Describe {} in a few sentences.", "How does {} work?", "Explain {} to a ten-year-old.",
        "What are the pros and cons of {}?", "Summarize what you know about {}.",
        "Compare {} with something similar.", "Teach me one interesting thing about {}.",
        "What are common misconceptions about {}?", "How would you explain {} to a friend?",
        "Write a short paragraph about {}.", "What questions should I ask to understand {}?",
        "Give an example that shows how {} works.", "What is the difference between {} and a related idea?",
        "Explain the main ideas behind {}.", "Write a short quiz about {} with answers.",
        "Why do people find {} interesting?", "What would happen if {} did not exist?",
        "Define {} and give an example.", "Can you tell me more about {}?",
        "Write a product description for a book about {}.", "Describe {} as if I had never heard of it.",
        "What are the key terms I should know about {}?", "How has {} changed over time?",
        "Explain why {} matters in everyday life.",
    ],
    "subject": [
        "Write a short story about {}.", "Write a short poem about {}.", "Tell me a bedtime story about {}.",
        "Write a funny story about {}.", "Write the opening paragraph of a novel about {}.",
        "Write a short story about {}, with a happy ending.", "Write a haiku about {}.",
        "Write a diary entry from the point of view of {}.", "Describe a day in the life of {}.",
        "Write a short dialogue about {}.", "Write a fable about {} with a moral at the end.",
        "Write a limerick about {}.", "Write a story for children about {}.",
        "Write a very short mystery story about {}.", "Write a letter from {} to a friend.",
    ],
}

TOPICS = {
    "activity": [
        "learning a new language", "gardening", "saving money", "running a marathon", "baking bread",
        "public speaking", "writing clean code", "learning to swim", "playing the guitar", "taking photographs",
        "studying for exams", "cooking for a family", "hiking in the mountains", "learning to draw",
        "managing a small team", "keeping a journal", "training a puppy", "growing tomatoes", "learning to code",
        "writing a resume", "preparing for a job interview", "meditating", "cycling to work", "decorating a room",
        "planning a trip abroad", "reading more books", "cleaning the house", "learning chess", "knitting",
        "building a website", "brewing coffee", "camping with children", "doing yoga at home", "making pizza",
        "writing poetry", "learning to juggle", "sleeping better", "eating less sugar", "playing the piano",
        "starting a podcast", "organizing a closet", "teaching a class", "painting with watercolors",
        "fixing a bicycle", "debugging a program", "making friends in a new city", "writing an essay",
        "learning to dance", "taking care of houseplants", "bird watching", "lifting weights", "making soup",
        "studying math", "giving feedback", "negotiating a salary", "recycling at home", "budgeting for a holiday",
        "learning to ski", "volunteering", "working from home", "climbing", "fishing", "making candles",
        "writing a novel", "learning sign language", "composting", "playing basketball", "sewing",
        "staying focused", "waking up early", "speaking to a large audience", "planning a wedding",
        "raising chickens", "learning history", "memorizing facts", "running a meeting", "shopping on a budget",
        "writing thank-you notes", "moving to a new house", "caring for an elderly parent",
    ],
    "concept": [
        "the solar system", "machine learning", "climate change", "the French revolution", "photosynthesis",
        "volcanoes", "the human heart", "electric cars", "the ocean", "ancient Rome", "bees", "black holes",
        "a linked list", "the internet", "gravity", "inflation", "democracy", "the immune system", "DNA",
        "the water cycle", "a binary search tree", "compound interest", "the Renaissance", "plate tectonics",
        "vaccines", "rainbows", "the stock market", "recursion", "the printing press", "earthquakes",
        "the Roman alphabet", "a neural network", "the moon", "renewable energy", "the brain", "money",
        "the Great Wall of China", "a compiler", "magnetism", "the periodic table", "supply and demand",
        "the Olympic Games", "coral reefs", "a database", "the speed of light", "evolution", "tides",
        "the Silk Road", "encryption", "an operating system", "cloud computing", "the Industrial Revolution",
        "dinosaurs", "the rain forest", "a sorting algorithm", "nuclear energy", "the pyramids of Egypt",
        "antibiotics", "the stomach", "the greenhouse effect", "a blockchain", "the metric system",
        "the human skeleton", "a sonnet", "jazz music", "the Moon landing", "electricity", "the atom",
        "a web browser", "the Amazon river", "sound waves", "the calendar", "a credit score", "glaciers",
        "the Vikings", "a spreadsheet", "the camera", "vitamins", "time zones", "the seasons", "a hurricane",
        "sleep", "the lungs", "the printing of money", "a programming language", "statistics", "probability",
        "the telephone", "a museum", "the Arctic", "wind power", "an algorithm", "the bicycle", "bread",
        "the heartbeat of a bird", "a recipe", "the Eiffel Tower", "honey", "a library", "the Milky Way",
        "solar panels", "a virus", "friendship", "chess openings", "the human eye", "a hash function",
        "a cache", "the alphabet", "the Mars rovers", "an earthquake warning system", "a sundial",
        "the history of tea", "the postal service", "bacteria", "the Sahara desert", "a submarine",
        "the piano", "origami", "the Fibonacci sequence", "a thermostat", "the ozone layer", "a lighthouse",
    ],
    "subject": [
        "a cat who wants to fly", "a lighthouse keeper", "a lost dog finding its way home", "a dragon who is afraid "
        "of fire", "a girl who finds a secret door", "two friends on a long train ride", "a baker who bakes "
        "magic bread", "an astronaut on Mars", "an old tree in a city park", "a detective who loves tea",
        "a child who talks to the moon", "a village by the sea", "a clock that runs backwards",
        "a musician who lost her voice", "a fox and a crow", "a snowman in spring", "a pirate who hates the sea",
        "the first day at a new school", "a garden that grows overnight", "a shy giant", "a small boat in a storm",
        "a library at midnight", "a kite that escapes", "a grandmother's recipe", "a city without cars",
        "a penguin who travels north", "a wizard who forgets spells", "a family road trip",
        "a robot who learns to cook", "a mouse in a museum", "a knight and a talking horse", "a rainy Sunday",
        "a letter that arrives fifty years late", "a lonely whale", "a train that never stops",
        "a painter and a sunflower", "a broken umbrella", "a bee who cannot find her hive",
        "a boy who collects stones", "an old map", "the last day of summer", "a chef in a tiny kitchen",
        "a star that falls into a forest", "a teacher who can read minds", "a market in the morning",
        "a turtle who wants to race", "two rival bakers", "a town where it always snows", "a ghost who is lonely",
        "a scientist and her assistant", "a cloud that wants to rain", "a dog who guards a bridge",
    ],
}

# Style: who asks / how (prefix) and the answer's form (suffix); "" is the plain prompt.
PREFIXES = ["", "", "", "Quick question: ", "I am a student. ", "Please help me. ", "Hi! ",
            "My friend asked me this and I did not know: ", "I have always wondered. ", "Hello, "]
SUFFIXES = ["", "", "", " Keep it short.", " Use simple words.", " Answer in three sentences.",
            " Use bullet points.", " Please be detailed.", " Be friendly.", " Give an example.",
            " Explain step by step.", " Answer in one paragraph."]


def held_out(i: int) -> bool:
    """Template and topic `i` of each kind's list is held out when this holds (every fifth, from the first)."""
    return i % 5 == 0


def pools() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
    """(training pool, held-out pool): every (kind, template, topic) pair of the split, in a fixed order."""
    train, held = [], []
    for kind, templates in TEMPLATES.items():
        topics = [t for t in TOPICS[kind] if t not in EXCLUDED_TOPICS]
        for i, template in enumerate(templates):
            for j, topic in enumerate(topics):
                if held_out(i) and held_out(j):
                    held.append((kind, template, topic))
                elif not held_out(i) and not held_out(j):
                    train.append((kind, template, topic))
    return train, held


def _compose(pool, n: int, rng: random.Random, styled: bool) -> list[str]:
    """`n` distinct prompts from `pool`: each pair at most once plain first, then with styles, until `n`."""
    order = list(pool)
    rng.shuffle(order)
    out, seen = [], set(BENCHMARK_CHAT)
    attempts = 0
    while len(out) < n:
        if attempts > 50 * max(n, 1):
            raise ValueError(f"cannot compose {n} distinct prompts from {len(pool)} template-topic pairs")
        _, template, topic = order[attempts % len(order)]
        plain = attempts < len(order) or not styled
        attempts += 1
        text = template.format(topic)
        if not plain:
            text = rng.choice(PREFIXES) + text + rng.choice(SUFFIXES)
            text = text[0].upper() + text[1:]
        if text not in seen:
            seen.add(text)
            out.append(text)
    return out


def split_prompts(n_train: int, n_held: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """`n_train` distinct training prompts and `n_held` distinct held-out prompts (disjoint by template and topic,
    none of BENCHMARK_CHAT). Held-out prompts are plain (the benchmark's form); training ones get styles."""
    train_pool, held_pool = pools()
    rng = random.Random(seed)
    return _compose(train_pool, n_train, rng, styled=True), _compose(held_pool, n_held, rng, styled=False)


if __name__ == "__main__":
    tr, ho = pools()
    print(f"{len(tr)} training template-topic pairs, {len(ho)} held-out pairs")
    a, b = split_prompts(20, 10)
    print("\n".join(["train:"] + a[:10] + ["held out:"] + b))
