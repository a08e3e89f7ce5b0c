"""Evaluation of pretrained checkpoints (docs/design.md, "Evaluation").

    perplexity   single-token perplexity: one held-out token masked at a time
    bert_inputs  BERT's input packing of fine-tuning examples ([CLS] a [SEP] b [SEP])
    heads        task heads on the pretrained encoder, and their losses
    metrics      accuracy, F1, Matthews, Pearson, Spearman as GLUE defines them
    glue         the nine GLUE tasks: TSV/TFDS readers, labels, metrics
    squad        SQuAD 2.0: JSON/TFDS reader, stride windows, decoding, official EM/F1
    race         RACE: folder/TFDS reader, multiple-choice encoding, accuracy
    protocols    FinetuneConfig and the paper's two protocols' settings (sweep, per-checkpoint)
    finetune     one fine-tuning run, and a protocol over batch size × lr × seeds
    run_eval     a run's checkpoints one after another, results under RUN/eval/ (what `pmi-jax eval` calls)
"""
