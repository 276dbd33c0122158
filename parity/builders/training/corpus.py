"""A deterministic synthetic corpus: short stories from a seeded probabilistic grammar.

Each story fixes a hero (name and pronouns), a job, a town, a pet and a friend,
then walks through numbered days and times of day. Content slots (adjectives,
numbers, places, items) are drawn with real entropy so a tiny model cannot
memorise the text and its greedy continuations do not collapse into loops,
while context carries over (the hero's name and pronoun, the pet, the place
that decides which items are found there, counts that are given away and
remembered at night, the day counter) so there is structure to learn.

Everything is a function of the seed: `random.Random(int)` only, no clock.
"""

from __future__ import annotations

import random
import re

from parity.builders.training.corpus_words import (
    MALE_NAMES, FEMALE_NAMES, TOWNS, JOBS, PERSON_ADJ, PETS, PET_ADJ, PET_ACTIONS, WILD, PREPS, PLACES,
    PLURALS, ITEM_ADJ, SIZE_ADJ, NUMBERS, ORDINALS, MOODS, SKY, WIND, WEATHER, FOODS, DRINKS, GIFTS,
    PACKABLE, DREAMS, MOVES, ADVERBS, SAYINGS, TIMES, ENDINGS, PRONOUNS,
)


def plural(noun: str, n: int) -> str:
    if n == 1:
        return noun
    return PLURALS.get(noun, noun + "s")


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:]


class _Story:
    def __init__(self, rng: random.Random):
        self.rng = rng
        self.gender = rng.choice("mf")
        self.name = rng.choice(MALE_NAMES if self.gender == "m" else FEMALE_NAMES)
        self.he, self.his, self.him = PRONOUNS[self.gender]
        self.friend = rng.choice([n for n in MALE_NAMES + FEMALE_NAMES if n != self.name])
        self.job = rng.choice(list(JOBS))
        self.town = rng.choice(TOWNS)
        self.pet = rng.choice(PETS)
        self.place = rng.choice(list(PLACES))
        self.item: str | None = None
        self.count = 0
        self.out: list[str] = []

    def say(self, text: str) -> None:
        self.out.append(_sentence(text))

    def subject(self) -> str:
        return self.rng.choice([self.name, self.he])

    def adjectives(self) -> str:
        r = self.rng
        if r.random() < 0.35:
            return f"{r.choice(SIZE_ADJ)} {r.choice(ITEM_ADJ)}"
        return r.choice(ITEM_ADJ)

    def intro(self) -> None:
        r = self.rng
        adj = r.choice(PERSON_ADJ)
        self.say(f"once upon a time, there was {article(adj)} {adj} {self.job} named {self.name} "
                 f"who lived in {self.town}.")
        adj = r.choice(PET_ADJ)
        self.say(f"{self.he} had {article(adj)} {adj} {self.pet} and a friend called {self.friend}.")
        if r.random() < 0.5:
            self.say(f"every day, {self.name} {r.choice(JOBS[self.job])}.")

    def day_opening(self, day: int) -> None:
        r = self.rng
        opening = r.choice([
            f"the sky was {r.choice(SKY)} and the wind was {r.choice(WIND)}.",
            f"{self.name} woke up {r.choice(['early', 'late'])} and felt {r.choice(MOODS)}.",
            f"it was {r.choice(WEATHER)} in {self.town}.",
        ])
        self.say(f"on the {ORDINALS[day]} day, {opening}")

    def go(self, time: str) -> None:
        r = self.rng
        self.place = r.choice(list(PLACES))
        company = r.choice([f" with {self.his} {self.pet}", f" with {self.friend}", " alone", ""])
        adverb = f" {r.choice(ADVERBS)}" if r.random() < 0.4 else ""
        time = time.lower()
        self.say(r.choice([
            f"{time}, {self.subject()} {r.choice(MOVES)}{adverb} to the {self.place}{company}.",
            f"{time}, {self.subject()} visited the {self.place}{company}.",
            f"{time}, {self.he} and {self.friend} {r.choice(MOVES)}{adverb} to the {self.place}.",
        ]))
        verbs, items, features = PLACES[self.place]
        self.item = r.choice(items)
        self.count = r.randint(1, 12)
        found = f"{r.choice(verbs)} {NUMBERS[self.count]} {self.adjectives()} {plural(self.item, self.count)}"
        self.say(r.choice([
            f"there {self.he} {found}.",
            f"at the {self.place}, {self.he} {found}.",
            f"{self.he} {found} {r.choice(PREPS)} the {r.choice(features)}.",
        ]))

    def event(self) -> None:
        r = self.rng
        kind = r.choices(["give", "pet", "meet", "feel", "eat", "gift", "see", "talk", "weather", "pack"],
                         weights=[3, 2, 1, 2, 1, 1, 2, 2, 1, 2])[0]
        feature = r.choice(PLACES[self.place][2])
        items = plural(self.item, 2) if self.item else "things"
        if kind == "give" and self.count < 2:
            kind = "gift"   # nothing to give away: a gift instead
        # NOTE: an event draws its words for every candidate sentence, then one is chosen: the draw order is the
        # corpus (a one-sentence event draws no choice)
        sentences = getattr(self, f"_event_{kind}")(r, feature, items)
        self.say(r.choice(sentences) if len(sentences) > 1 else sentences[0])

    def _event_give(self, r, feature: str, items: str) -> list[str]:
        given = r.randint(1, self.count - 1)
        self.count -= given
        return [
            f"{self.subject()} gave {NUMBERS[given]} {plural(self.item, given)} to {self.friend}, "
            f"so {self.he} had {NUMBERS[self.count]} left.",
            f"{self.friend} took {NUMBERS[given]} {plural(self.item, given)}, and "
            f"{NUMBERS[self.count]} {'was' if self.count == 1 else 'were'} left.",
        ]

    def _event_pet(self, r, feature: str, items: str) -> list[str]:
        return [
            f"the {self.pet} {r.choice(PET_ACTIONS)} {r.choice(PREPS)} the {feature}.",
            f"{self.his} {self.pet} {r.choice(PET_ACTIONS)} {r.choice(ADVERBS)}.",
            f"the {self.pet} looked {r.choice(MOODS)}.",
        ]

    def _event_meet(self, r, feature: str, items: str) -> list[str]:
        job = r.choice(list(JOBS))
        adj = r.choice(PERSON_ADJ)
        return [f"at the {self.place}, {self.he} met {article(adj)} {adj} {job} who {r.choice(JOBS[job])}."]

    def _event_feel(self, r, feature: str, items: str) -> list[str]:
        return [
            f"{self.subject()} felt {r.choice(MOODS)} because the {items} were {r.choice(ITEM_ADJ)}.",
            f"{self.subject()} was {r.choice(MOODS)} and {r.choice(MOODS)}.",
            f"{self.he} felt {r.choice(MOODS)}.",
        ]

    def _event_eat(self, r, feature: str, items: str) -> list[str]:
        return [
            f"{self.he} ate {r.choice(FOODS)} and drank {r.choice(DRINKS)}.",
            f"for lunch, {self.he} had {r.choice(FOODS)} with {r.choice(FOODS)}.",
        ]

    def _event_see(self, r, feature: str, items: str) -> list[str]:
        animal = r.choice(WILD)
        n = r.randint(1, 6)
        return [
            f"{self.subject()} saw {NUMBERS[n]} {r.choice(ITEM_ADJ)} {plural(animal, n)} "
            f"{r.choice(PREPS)} the {feature}.",
            f"a {r.choice(SIZE_ADJ)} {animal} {r.choice(PET_ACTIONS)} {r.choice(PREPS)} the {feature}.",
        ]

    def _event_talk(self, r, feature: str, items: str) -> list[str]:
        saying = r.choice(SAYINGS).format(place=self.place, pet=self.pet, mood=r.choice(MOODS),
                                          weather=r.choice(WEATHER), he=self.he,
                                          items=items, adj=r.choice(ITEM_ADJ))
        return [
            f"{self.friend} said that {saying}.",
            f"{self.friend} asked {self.name} about the {items}.",
            f"{self.subject()} told {self.friend} about the {r.choice(list(PLACES))}.",
        ]

    def _event_weather(self, r, feature: str, items: str) -> list[str]:
        return [
            f"then the sky turned {r.choice(SKY)}.",
            f"suddenly it began to {r.choice(['rain', 'snow'])}.",
            f"the wind became {r.choice(WIND)}.",
        ]

    def _event_pack(self, r, feature: str, items: str) -> list[str]:
        things = [f"{article(g)} {g}" for g in r.sample(PACKABLE, 3)]
        return [f"{self.subject()} put {things[0]}, {things[1]} and {things[2]} in {self.his} "
                 f"{r.choice(['bag', 'basket', 'box'])}."]

    def _event_gift(self, r, feature: str, items: str) -> list[str]:
        adj = r.choice(ITEM_ADJ)
        return [
            f"{self.friend} said thank you and gave {self.name} {article(adj)} {adj} {r.choice(GIFTS)}!",
            f"{self.friend} gave {self.name} {article(adj)} {adj} {r.choice(GIFTS)}.",
        ]

    def night(self) -> None:
        r = self.rng
        if self.item is not None and r.random() < 0.5:
            self.say(f"at night, {self.name} counted the {plural(self.item, 2)}, and there "
                     f"{'was' if self.count == 1 else 'were'} {NUMBERS[self.count]}.")
        else:
            self.say(f"that night, {self.he} dreamed about {r.choice(DREAMS)}.")

    def ending(self) -> None:
        r = self.rng
        end = r.choice(ENDINGS).format(town=self.town, pet=self.pet)
        self.say(f"in the end, {self.name} was {r.choice(MOODS)} and {self.he} {end}.")
        self.say("the end.")

    def tell(self) -> str:
        r = self.rng
        self.intro()
        for day in range(r.choice([2, 2, 3, 3, 4, 5])):
            self.day_opening(day)
            for time in TIMES:
                if r.random() < 0.4:
                    continue
                self.go(time)
                for _ in range(r.choice([1, 1, 2, 2, 3, 4])):
                    self.event()
            self.night()
        self.ending()
        return " ".join(self.out)


def generate_story(rng: random.Random) -> str:
    return _Story(rng).tell()


def _rng(seed: int, split: str) -> random.Random:
    # NOTE: integer seeds: random.Random(int) is the same on every run and platform
    # (hash randomisation never touches it), and each split gets its own stream.
    return random.Random(seed * 1009 + {"train": 1, "heldout": 2, "vocab": 3}[split])


def generate_corpus(seed: int, num_stories: int, split: str = "train") -> list[str]:
    """`num_stories` stories for `seed`; `split` selects independent streams (train / heldout)."""
    rng = _rng(seed, split)
    return [generate_story(rng) for _ in range(num_stories)]


def words(text: str) -> list[str]:
    """The word-level tokens of `text`: words, with each punctuation mark a word of its own."""
    return re.findall(r"\w+|[^\w\s]", text)


def vocabulary() -> list[str]:
    """Every word the grammar can produce, sorted (special tokens not included)."""
    vocab: set[str] = set()
    lists = [MALE_NAMES, FEMALE_NAMES, TOWNS, list(JOBS), *JOBS.values(), PERSON_ADJ, PETS,
             PET_ADJ, PET_ACTIONS, WILD, [plural(w, 2) for w in WILD], PREPS, ITEM_ADJ, SIZE_ADJ,
             NUMBERS, ORDINALS, MOODS, SKY, WIND, WEATHER, FOODS, DRINKS, GIFTS, DREAMS, MOVES,
             ADVERBS, SAYINGS, TIMES, ENDINGS, list(PLACES), ["early", "late", "alone", "was", "were",
                                                               "rain", "snow", "things", "bag"]]
    for verbs, items, features in PLACES.values():
        lists += [verbs, items, [plural(i, 2) for i in items], features]
    for entries in lists:
        for entry in entries:
            vocab.update(words(re.sub(r"{\w+}", "", entry)))
    for he, his, _ in PRONOUNS.values():
        vocab.update([he, his, he.capitalize()])
    # literal words of the templates above, gathered from a fixed sample of stories
    sample = _rng(0, "vocab")
    for _ in range(400):
        vocab.update(words(generate_story(sample)))
    return sorted(vocab)


def heldout_prompts(seed: int, count: int = 16, min_words: int = 4, max_words: int = 20) -> list[dict]:
    """`count` prompts cut from held-out stories: a sentence start plus a few words, ending mid-sentence.

    Each prompt starts at a sentence boundary in the first half of a held-out
    story, so it carries the story's context words, and stops 4-20 words later
    before a word that is not the end of the sentence.
    """
    rng = _rng(seed, "heldout")
    prompts = []
    while len(prompts) < count:
        story = generate_story(rng)
        sentences = re.split(r"(?<=[.!]) ", story)
        first = rng.randrange(0, max(1, len(sentences) // 2))
        toks = " ".join(sentences[first:]).split(" ")
        length = rng.randint(min_words, max_words)
        # step back until the prompt ends mid-sentence (its last word is not final punctuation
        # and the next word continues the sentence)
        while length > min_words and (toks[length - 1][-1] in ".!" or length >= len(toks)):
            length -= 1
        if toks[length - 1][-1] in ".!,":
            continue
        prompts.append({"id": f"p{len(prompts)}", "text": " ".join(toks[:length])})
    return prompts
