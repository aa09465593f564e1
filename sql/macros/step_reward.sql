-- Which reward a sample's step is judged by, written once for group_stats and step_stats
-- (docs/columns.md, "The step's reward").
-- Macros:
--   step_reward(framework, evaluation, reward, raw_reward)  a training sample of a framework
--                           whose train dump records the batch's raw reward (miles, slime; a
--                           NULL framework is a lake written before runs recorded it, when
--                           tokenlake read only those) counts its raw_reward, NULL without a
--                           train side; any other training sample (NeMo-RL logs only `rewards`)
--                           and every eval sample count the sample's reward
CREATE OR REPLACE MACRO step_reward(framework, evaluation, reward, raw_reward) AS
    CASE
        WHEN NOT evaluation AND COALESCE(framework, 'miles') IN ('miles', 'slime') THEN raw_reward
        ELSE reward
    END;
