"""The word lists the story grammar draws from (corpus.py)."""

MALE_NAMES = ["Tom", "Sam", "Ben", "Leo", "Max", "Jack", "Finn", "Owen",
              "Hugo", "Noah", "Eli", "Adam", "Oscar", "Theo"]
FEMALE_NAMES = ["Mia", "Anna", "Lily", "Emma", "Rose", "Nora", "Ella", "Ruby",
                "Clara", "Ivy", "Lucy", "Maya", "Zoe", "Alice"]
TOWNS = ["Oakvale", "Riverton", "Millbrook", "Stonehill", "Ashford", "Greenwood",
         "Fairport", "Redwater", "Elmstead", "Brightfield", "Westmoor", "Pinecrest"]
# job -> things people of that job do (phrases the model can copy once it knows the job)
JOBS = {
    "baker": ["sold warm bread", "baked sweet cakes"],
    "farmer": ["grew tall corn", "fed the cows"],
    "sailor": ["told stories about the sea", "fixed old boats"],
    "teacher": ["taught the children to read", "wrote long letters"],
    "painter": ["painted the old houses", "painted the sea"],
    "doctor": ["helped the sick animals", "made warm tea"],
    "fisher": ["caught silver fish", "fixed old boats"],
    "miller": ["ground the wheat into flour", "sold warm bread"],
    "singer": ["sang songs every night", "told stories about the sea"],
    "tailor": ["made fine coats", "sold cloth and spices"],
    "hunter": ["walked in the woods", "fed the cows"],
    "builder": ["built stone walls", "fixed old boats"],
    "gardener": ["grew red roses", "grew tall corn"],
    "merchant": ["sold cloth and spices", "counted gold coins"],
}
PERSON_ADJ = ["kind", "brave", "clever", "quiet", "young", "old", "cheerful", "gentle",
              "curious", "busy", "honest", "shy"]
PETS = ["cat", "dog", "fox", "owl", "horse", "rabbit", "goat", "duck", "pony", "parrot",
        "hamster", "turtle"]
PET_ADJ = ["little", "fluffy", "grey", "brown", "white", "black", "spotted", "sleepy", "lazy",
           "playful"]
PET_ACTIONS = ["slept", "played", "ran", "jumped", "sat", "rested", "hid", "waited", "danced",
               "sang"]
WILD = ["bird", "frog", "squirrel", "deer", "snail", "mouse", "beetle", "swan"]
PREPS = ["near", "under", "behind", "beside", "by"]
# place -> (verbs used there, items found there, features of the place)
PLACES = {
    "market": (["bought", "chose", "sold"], ["apple", "pear", "plum", "lemon", "onion", "carrot"], ["stalls", "carts"]),
    "forest": (["found", "picked", "collected"], ["mushroom", "acorn", "feather", "pinecone", "berry", "stick"], ["trees", "bushes"]),
    "river": (["found", "collected", "saw"], ["pebble", "shell", "stone", "reed"], ["water", "bridge"]),
    "garden": (["picked", "grew", "planted"], ["flower", "tomato", "bean", "rose", "pumpkin"], ["fence", "well"]),
    "library": (["read", "borrowed", "found"], ["book", "map", "letter", "poem"], ["shelves", "window"]),
    "beach": (["found", "collected", "saw"], ["shell", "pebble", "crab", "stone"], ["waves", "rocks"]),
    "farm": (["bought", "collected", "counted"], ["egg", "carrot", "potato", "apple"], ["barn", "gate"]),
    "bakery": (["bought", "chose", "ate"], ["bun", "cookie", "pie", "cake"], ["oven", "door"]),
    "meadow": (["picked", "saw", "counted"], ["flower", "butterfly", "daisy", "bee"], ["grass", "hedge"]),
    "hill": (["found", "saw", "counted"], ["stone", "feather", "flower", "cloud"], ["top", "rocks"]),
    "shop": (["bought", "chose", "found"], ["toy", "ball", "kite", "drum"], ["door", "window"]),
    "school": (["found", "borrowed", "counted"], ["pencil", "book", "crayon", "map"], ["desks", "window"]),
}
PLURALS = {"berry": "berries", "daisy": "daisies", "butterfly": "butterflies", "tomato": "tomatoes",
           "potato": "potatoes", "mouse": "mice", "deer": "deer"}
ITEM_ADJ = ["red", "green", "yellow", "blue", "round", "shiny", "old", "fresh", "heavy", "soft",
            "bright", "strange", "lovely", "dusty", "smooth", "sweet", "golden", "purple", "wet", "pretty"]
SIZE_ADJ = ["small", "big", "tiny", "large", "long", "short"]
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
           "eleven", "twelve"]
ORDINALS = ["first", "second", "third", "fourth", "fifth"]
MOODS = ["happy", "tired", "proud", "sleepy", "calm", "excited", "hungry", "glad", "worried",
         "lonely", "surprised", "cheerful"]
SKY = ["grey", "clear", "blue", "cloudy", "dark", "bright", "pink"]
WIND = ["soft", "strong", "cold", "warm", "gentle", "wild"]
WEATHER = ["cold", "warm", "rainy", "sunny", "quiet", "windy", "foggy"]
FOODS = ["soup", "bread", "porridge", "rice", "cheese", "noodles", "stew", "salad", "eggs", "pie"]
DRINKS = ["tea", "milk", "water", "juice", "cocoa"]
GIFTS = ["hat", "scarf", "ribbon", "cup", "lamp", "basket", "coin", "candle", "bell", "box"]
PACKABLE = GIFTS + ["apple", "pear", "lemon", "onion", "book", "map", "ball", "kite", "pencil", "shell"]
DREAMS = ["the sea", "the stars", "a big castle", "a golden boat", "the moon", "a tall tower",
          "a green dragon", "a long road", "a quiet island", "a flying ship"]
MOVES = ["went", "walked", "ran", "hurried", "wandered", "rode"]
ADVERBS = ["slowly", "quickly", "quietly", "happily", "carefully", "early"]
SAYINGS = ["the {place} was lovely today", "the {pet} looked {mood}", "tomorrow would be {weather}",
           "{he} should rest now", "the {items} were very {adj}"]
TIMES = ["In the morning", "At noon", "In the afternoon", "In the evening"]
ENDINGS = ["lived happily in {town}", "never forgot the {pet}", "told the story to everyone",
           "went to sleep with a smile", "planned a new trip", "wrote it all in a book"]

PRONOUNS = {"m": ("he", "his", "him"), "f": ("she", "her", "her")}
