#!/usr/bin/env python3
"""The official `openai` Python client against `xfmr serve`, unchanged: chat (whole and
streamed), completions and embeddings, each answer checked.

    pip install openai
    xfmr serve --llm smollm2 --embeddings minilm --port 8080 &
    python benches/serve_openai.py --base-url http://127.0.0.1:8080/v1

Exits non-zero on the first answer that is not what the API promises.
"""

import argparse
import math
import sys

from openai import OpenAI


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--llm", default="smollm2")
    parser.add_argument("--embeddings", default="minilm")
    args = parser.parse_args()
    # The server checks no key; the client insists on one.
    client = OpenAI(base_url=args.base_url, api_key="unused")

    models = [m.id for m in client.models.list().data]
    print("models:", models)
    assert args.llm in models and args.embeddings in models, models

    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    chat = client.chat.completions.create(
        model=args.llm, messages=messages, max_tokens=16, temperature=0, seed=1
    )
    answer = chat.choices[0].message.content
    print(f"chat: {answer!r} ({chat.choices[0].finish_reason}, usage {chat.usage})")
    assert "Paris" in answer and chat.usage.completion_tokens > 0

    pieces = []
    stream = client.chat.completions.create(
        model=args.llm,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
    print(f"chat, streamed in {len(pieces)} chunks: {''.join(pieces)!r} (usage {usage})")
    assert "".join(pieces) == answer, "the stream and the whole answer differ"
    assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens

    completion = client.completions.create(
        model=args.llm, prompt="The three primary colours are", max_tokens=20, temperature=0
    )
    print(f"completion: {completion.choices[0].text!r}")
    assert completion.choices[0].text and completion.usage.prompt_tokens > 0

    sentences = ["A man is eating food.", "A man is eating a piece of bread.", "The sky is blue."]
    embedded = client.embeddings.create(model=args.embeddings, input=sentences)
    vectors = [d.embedding for d in embedded.data]

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(
            sum(x * x for x in a) * sum(y * y for y in b)
        )

    near, far = cosine(vectors[0], vectors[1]), cosine(vectors[0], vectors[2])
    print(f"embeddings: {len(vectors)} × {len(vectors[0])}, cos(food, bread) {near:.3f}, "
          f"cos(food, sky) {far:.3f}")
    assert len(vectors[0]) == 384 and near > far

    try:
        client.chat.completions.create(model="no-such-model", messages=messages)
        raise AssertionError("an unknown model was accepted")
    except Exception as e:  # openai.NotFoundError
        print(f"unknown model: {type(e).__name__}: {e}")
        assert type(e).__name__ == "NotFoundError"
    print("openai client: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
