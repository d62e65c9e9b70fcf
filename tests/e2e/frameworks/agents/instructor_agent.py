"""instructor: one response model (``Sum``) asked for in three modes. ``Mode.TOOLS`` (instructor's default)
sends it as a tool with a named ``tool_choice``, ``Mode.JSON_SCHEMA`` as a ``response_format`` json_schema:
the server constrains both, so even an untrained model's reply parses into ``Sum``. ``Mode.JSON`` sends
``response_format: json_object`` with the schema only in the prompt: any JSON object comes back, and a
model that has not learned the schema fails instructor's validation (after its retries), or writes an
object so long that it ends at the context's end (``IncompleteOutputException``)."""

from __future__ import annotations

import os

import instructor
import openai
from instructor.core import InstructorError
from pydantic import BaseModel


class Sum(BaseModel):
    """The sum of two integers."""

    total: int


def main() -> dict:
    client = openai.OpenAI(base_url=os.environ["SWARM_BASE_URL"], api_key=os.environ["SWARM_RUN_KEY"])
    answers: dict[str, object] = {}
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA, instructor.Mode.JSON):
        structured = instructor.from_openai(client, mode=mode)
        try:
            answer = structured.chat.completions.create(
                model=os.environ["SWARM_MODEL"], response_model=Sum,
                messages=[{"role": "user", "content": "What is 2 + 3?"}])
            answers[mode.name] = answer.model_dump()
        except InstructorError as exc:  # the reply did not validate (after the retries), or was cut off
            answers[mode.name] = {"error": type(exc).__name__, "cause": type(exc.__cause__ or exc).__name__,
                                  "message": str(exc)[-300:]}
    return answers


if __name__ == "__main__":
    print(main())
