"""Untrained Hugging Face tokenizers of the kinds `--tokenizer` accepts, for tests to train."""
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers


def cased_wordpiece() -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    return tokenizer


def unigram() -> Tokenizer:
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC()])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    return tokenizer
