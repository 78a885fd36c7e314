"""export-hf's folder kinds, one recipe module each (`folder_recipe.FolderRecipe`; the
table from task and runtime to recipe is fx2onnx/hub/recipe_table.py): causal LMs
(causal_lm.py), encoders and image classifiers (encoder.py), the one-pass pipeline tasks
(pipeline_task.py), sequence-to-sequence models (seq2seq.py), Whisper for ONNX Runtime
GenAI (whisper_genai.py) and image-text-to-text models (image_text_to_text.py). A recipe
imports no other recipe: what they share is in hub/shared/ and hub/decoders/."""
